"""The event loop stays free while the engine scores and embeds the largest requests it admits:
`/health` answers within 0.5 s throughout."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.builders.zoo import tiny_colbert

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LARGEST = 2048  # the default max_inputs_per_request


def health_latencies(url: str, stop: threading.Event) -> list[float]:
    seen: list[float] = []

    def poll() -> None:
        with httpx.Client(base_url=url, timeout=10) as client:
            while not stop.is_set():
                started = time.monotonic()
                assert client.get("/health").status_code == 200
                seen.append(time.monotonic() - started)
                time.sleep(0.05)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    stop.wait()
    thread.join(15)
    return seen


@pytest.mark.parametrize(
    ("route", "body"),
    [
        (
            "/rerank",
            {
                "model": "colbert",
                "query": "which words",
                "documents": [f"a document of words {i}" for i in range(LARGEST)],
            },
        ),
        (
            "/v1/encode",
            {
                "model": "colbert",
                "input": [f"a document of words {i}" for i in range(LARGEST)],
                "outputs": ["multivector"],
            },
        ),
    ],
)
def test_health_answers_within_half_a_second_during_the_largest_request(
    serve: Any, tmp_path: Path, route: str, body: dict[str, Any]
) -> None:
    model = {"name": "colbert", "source": str(tiny_colbert(tmp_path / "colbert")), "backend": "torch", "pin": True}
    server = serve({"models": [model], "request_timeout": 300})
    stop = threading.Event()
    latencies: list[float] = []
    watcher = threading.Thread(target=lambda: latencies.extend(health_latencies(server.url, stop)))
    watcher.start()
    try:
        with server.client(timeout=300) as client:
            response = client.post(route, json=body)
    finally:
        stop.set()
        watcher.join(30)
    assert response.status_code == 200, response.text[:500]
    assert len(latencies) >= 3, "the request ended before /health was asked"
    assert max(latencies) < 0.5, f"/health took {max(latencies):.2f}s while {route} was answered"
