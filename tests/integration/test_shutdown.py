"""Graceful shutdown of a real `infinity-server serve` process on a real SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest

from model_registry.adapters.fake import fake_vector
from tests.conftest import REPO, free_port
from tests.waiting import eventually

pytestmark = pytest.mark.integration

DELAY = 0.8  # seconds each batch's forward takes; one item per batch (max_batch_tokens 2)


@contextmanager
def server_process(tmp_path: Path, grace: float, delay: float) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    config = tmp_path / "models.yaml"
    config.write_text(
        "models:\n"
        "  - {name: slow, source: fake, kind: fake, pin: true, max_batch_tokens: 2,\n"
        f"     options: {{delay: {delay}}}}}\n"
        f"server: {{graceful_timeout: {grace}}}\n"
    )
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    command = [sys.executable, "-m", "infinity_server.cli", "serve", "--config", str(config)]
    log = (tmp_path / "server.log").open("wb")
    process = subprocess.Popen(
        [*command, "--host", "127.0.0.1", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            pytest.fail("the server process did not become ready")
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        log.close()


def embed(url: str, text: str) -> httpx.Response:
    return httpx.post(url + "/v1/embeddings", json={"model": "slow", "input": [text]}, timeout=30)


def in_flight(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    line = next(row for row in text.splitlines() if row.startswith("infinity_requests_in_flight "))
    return float(line.split()[1])


def wait_for_in_flight(url: str, count: int) -> None:
    eventually(lambda: in_flight(url), lambda seen: seen >= count)


def test_sigterm_drains_requests_in_flight_then_exits_0(tmp_path: Path) -> None:
    texts = [f"words number {i}" for i in range(3)]
    with server_process(tmp_path, grace=20, delay=DELAY) as (process, url), ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(embed, url, text) for text in texts]
        wait_for_in_flight(url, len(texts))
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        ready = httpx.get(url + "/ready", timeout=5)
        assert ready.status_code == 503
        assert ready.json()["draining"] is True
        turned_away = embed(url, "too late")
        assert turned_away.status_code == 503
        assert turned_away.json()["error"]["code"] == "shutting_down"
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        # One batch at a time: at least the last of the three is still in flight after the signal.
        assert not all(f.done() for f in futures), "the requests should still be in flight"
        for text, future in zip(texts, futures, strict=True):
            response = future.result(30)
            assert response.status_code == 200, response.text
            vector = np.asarray(response.json()["data"][0]["embedding"], dtype=np.float32)
            np.testing.assert_allclose(vector, fake_vector(text, 8), atol=1e-6)
        assert process.wait(30) == 0, (tmp_path / "server.log").read_text()
        # The batches still to run after the signal took at least one forward pass.
        assert time.monotonic() - signalled >= DELAY


def test_the_grace_period_bounds_the_drain(tmp_path: Path) -> None:
    delay = 6.0
    with server_process(tmp_path, grace=0.5, delay=delay) as (process, url), ThreadPoolExecutor(1) as pool:
        stuck = pool.submit(embed, url, "never finishes in time")
        wait_for_in_flight(url, 1)
        time.sleep(0.3)  # past the queue, into the forward pass
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        cut = stuck.result(30)
        assert cut.status_code == 503
        assert cut.json()["error"]["code"] == "shutting_down"
        # Cut at the end of the grace period, well before its forward pass would have ended.
        assert time.monotonic() - signalled < delay - 2
        assert process.wait(30) == 0
