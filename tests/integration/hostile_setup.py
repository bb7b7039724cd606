"""A real server in its own process, and a watcher that polls its /health and samples its RSS.

The server runs as `python -m infinity_server.cli serve` (the command users run), so its RSS is
its own and not the test process's. The watcher runs on a thread for the whole module: every
`POLL` seconds it times one `GET /health` and reads the server's RSS with psutil.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from tests.conftest import REPO, free_port

POLL = 0.05


@dataclass
class Watch:
    """What the watcher saw since the last `reset`: /health latencies and failures, the peak RSS."""

    slowest: float = 0.0
    polls: int = 0
    failures: list[str] = field(default_factory=list)
    peak_rss: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self, rss: int) -> None:
        with self.lock:
            self.slowest, self.polls, self.failures, self.peak_rss = 0.0, 0, [], rss

    def wait_for_poll(self, timeout: float) -> bool:
        """True once at least one poll was recorded since the last reset (a fast test may end first)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self.polls:
                    return True
            time.sleep(POLL / 2)
        return False

    def record(self, seconds: float, failure: str | None, rss: int) -> None:
        with self.lock:
            self.slowest = max(self.slowest, seconds)
            self.polls += 1
            self.peak_rss = max(self.peak_rss, rss)
            if failure is not None:
                self.failures.append(failure)


@dataclass
class ServerProcess:
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    watch: Watch
    #: The RSS that growth is measured from (set once the models are loaded and warm).
    baseline: int = 0

    @property
    def rss(self) -> int:
        return int(psutil.Process(self.process.pid).memory_info().rss)

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kwargs.pop("timeout", 120), **kwargs)


def _watch(server: ServerProcess, stop: threading.Event) -> None:
    process = psutil.Process(server.process.pid)
    with httpx.Client(base_url=server.url, timeout=5) as client:
        while not stop.is_set():
            started, failure = time.perf_counter(), None
            try:
                status = client.get("/health").status_code
                failure = None if status == 200 else f"/health answered {status}"
            except httpx.HTTPError as error:
                failure = f"/health failed: {type(error).__name__} {error}"
            elapsed = time.perf_counter() - started
            try:
                rss = int(process.memory_info().rss)
            except psutil.Error:
                rss = 0
            server.watch.record(elapsed, failure, rss)
            stop.wait(POLL)


def _wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 180
    with httpx.Client(base_url=url, timeout=2) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited with {process.returncode}:\n{log.read_text()[-4000:]}")
            try:
                if client.get("/ready").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
    raise RuntimeError(f"the server did not become ready:\n{log.read_text()[-4000:]}")


@contextmanager
def server_process(config: dict[str, Any], workdir: Path) -> Iterator[ServerProcess]:
    """Serve `config` (a models.yaml as a dict) on a free port until the block ends (SIGTERM, then kill)."""
    port = free_port()
    path, log = workdir / "models.yaml", workdir / "server.log"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    command = [sys.executable, "-m", "infinity_server.cli", "serve", "--config", str(path), "--port", str(port)]
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env, cwd=workdir)
    server = ServerProcess(f"http://127.0.0.1:{port}", process, log, Watch())
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(server, stop), name="health-watch", daemon=True)
    try:
        _wait_healthy(server.url, process, log)
        watcher.start()
        yield server
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join(10)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
