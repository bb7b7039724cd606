"""Shared fixtures: the real data, a real server on a real port, tiny models."""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from benchmarks.lib import datasets
from benchmarks.lib.datasets import read_sts as read_sts  # the STS-benchmark reader, for the tests

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# Engine artifacts (ONNX exports, CTranslate2 conversions) of models that name no cache go to one
# directory of this run, shared by the servers it starts, never to the user's own cache.
_ENGINE_CACHE = tempfile.mkdtemp(prefix="infinity-engines-")
os.environ.setdefault("INFINITY_ENGINE_CACHE", _ENGINE_CACHE)
atexit.register(shutil.rmtree, _ENGINE_CACHE, ignore_errors=True)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real data (`benchmarks/lib/datasets.py` says where it is looked for)."""
    folder = datasets.data_dir()
    if not folder.is_dir():
        pytest.fail(
            f"the data directory {folder} is missing: put shared/data beside the checkout or set {datasets.DATA_ENV}"
        )
    return folder


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LiveServer:
    """A Hypercorn server on 127.0.0.1, run on its own thread and event loop."""

    app: Any
    port: int
    thread: threading.Thread
    stop_event: asyncio.Event
    loop: asyncio.AbstractEventLoop

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kwargs.pop("timeout", 120), **kwargs)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(60)


def start_server(app: Any) -> LiveServer:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    port = free_port()
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.graceful_timeout = 1
    # Longer than any pause between a test's requests: a client reusing a connection just as the
    # server's keep-alive timer closes it sees "server disconnected" (a race, not the app's answer).
    config.keep_alive_timeout = 120
    started = threading.Event()
    holder: dict[str, Any] = {}

    def run() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        stop = asyncio.Event()
        holder["loop"], holder["stop"] = loop, stop
        started.set()
        loop.run_until_complete(serve(app, config, shutdown_trigger=stop.wait))
        loop.close()

    thread = threading.Thread(target=run, name=f"server-{port}", daemon=True)
    thread.start()
    started.wait(10)
    server = LiveServer(app, port, thread, holder["stop"], holder["loop"])
    # Pinned models load in the background once the port is open: tests start from a settled server.
    registry = getattr(getattr(app, "state", None), "registry", None)
    with httpx.Client(base_url=server.url, timeout=5) as client:
        for _ in range(3000):
            try:
                if client.get("/health").status_code == 200 and (registry is None or registry.pinned_tried):
                    return server
            except httpx.TransportError:
                pass
            threading.Event().wait(0.1)
    server.close()
    raise RuntimeError("the test server did not start")


@pytest.fixture
def serve() -> Iterator[Any]:
    """`serve(config_dict, **server_settings)` -> a LiveServer; all are stopped at teardown."""
    from infinity_server.app import create_app
    from infinity_server.settings import ServerSettings, Settings
    from model_registry.config import registry_config

    servers: list[LiveServer] = []

    def make(config: dict[str, Any], **server: Any) -> LiveServer:
        registry_data = {k: v for k, v in config.items() if k != "server"}
        settings = Settings(ServerSettings(**server), registry_config(registry_data))
        live = start_server(create_app(settings))
        servers.append(live)
        return live

    yield make
    for live in servers:
        live.close()
