"""Bulk embedding clients over HTTP: one request read as a client would, and 4 clients draining a
list of requests, timed from the first request to the last answer."""

from __future__ import annotations

import asyncio
import base64
import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

#: The name the benchmarks serve the bundled all-MiniLM-L6-v2 under.
MODEL = "all-MiniLM-L6-v2"


@dataclass
class Run:
    """One bulk run: inputs, tokens, wall seconds and the requests' latency percentiles."""

    name: str
    inputs: int
    tokens: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def inputs_per_s(self) -> float:
        return self.inputs / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def send(
    client: httpx.AsyncClient, texts: list[str], encoding_format: str = "float", model: str = MODEL
) -> tuple[float, int]:
    """One request, its answer read as a client would: JSON numbers parsed, or (with "base64", what
    the openai client asks for by default) each vector decoded into a numpy array."""
    started = time.perf_counter()
    body: dict[str, Any] = {"model": model, "input": texts}
    if encoding_format != "float":
        body["encoding_format"] = encoding_format
    response = await client.post("/v1/embeddings", json=body)
    response.raise_for_status()
    answer = response.json()
    if encoding_format == "base64":
        vectors = [np.frombuffer(base64.b64decode(d["embedding"]), dtype=np.float32) for d in answer["data"]]
        assert len(vectors) == len(texts)
    return time.perf_counter() - started, int(answer["usage"]["total_tokens"])


async def bulk(
    url: str,
    name: str,
    requests: list[list[str]],
    clients: int = 4,
    encoding_format: str = "float",
    model: str = MODEL,
) -> Run:
    queue: asyncio.Queue[list[str]] = asyncio.Queue()
    for request in requests:
        queue.put_nowait(request)
    latencies: list[float] = []
    tokens = 0

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal tokens
        async with client:
            while not queue.empty():
                seconds, used = await send(client, queue.get_nowait(), encoding_format, model)
                latencies.append(seconds)
                tokens += used

    # Built before the clock starts: an httpx client loads its TLS context when built (tens of
    # milliseconds each here), which is the client's start-up, not the server's work.
    pool = [httpx.AsyncClient(base_url=url, timeout=600) for _ in range(clients)]
    started = time.perf_counter()
    await asyncio.gather(*(client_loop(client) for client in pool))
    elapsed = time.perf_counter() - started
    inputs = sum(len(r) for r in requests)
    return Run(name, inputs, tokens, elapsed, percentile(latencies, 50) * 1e3, percentile(latencies, 99) * 1e3)
