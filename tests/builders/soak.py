"""Soak traffic shared by `tests/lifecycle/test_soak.py` and `benchmarks/soak.py`: fake models that
really hold their bytes, a Zipf-like mix of embedding requests from concurrent clients, and an
RSS sampler."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from model_registry.runtime.memory import process_rss

MIB = 2**20
WORDS = (
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "cats",
    "watch",
    "from",
    "window",
)


def soak_models(
    count: int, mib: int, *, pinned: bool = False, delay: float = 0.003, load_delay: float = 0.02
) -> list[dict[str, Any]]:
    """`count` fake models of `mib` MiB each, really allocated, a few milliseconds per batch."""
    options = {"footprint": mib * MIB, "allocate": True, "delay": delay, "load_delay": load_delay}
    return [
        {"name": f"m{i}", "source": "fake", "kind": "fake", "pin": pinned, "options": dict(options)}
        for i in range(count)
    ]


@dataclass
class SoakResult:
    statuses: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0
    peak_rss: int = 0

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) if self.latencies else 0.0


def _request(rng: random.Random, models: int) -> tuple[str, dict[str, Any]]:
    """A Zipf-like pick of model (a few hot, a long cold tail) and a mixed batch of texts."""
    weights = [1.0 / (k + 1) for k in range(models)]
    model = f"m{rng.choices(range(models), weights)[0]}"
    texts = [" ".join(rng.choices(WORDS, k=rng.randint(1, 40))) for _ in range(rng.choice((1, 1, 2, 4, 8, 32)))]
    return model, {"model": model, "input": texts}


async def drive(url: str, *, requests: int, clients: int, models: int, seed: int = 0) -> SoakResult:
    """Send `requests` mixed requests from `clients` concurrent clients; one in 50 lists /models."""
    result, counter = SoakResult(), iter(range(requests))
    rng = random.Random(seed)
    plan = [_request(rng, models) for _ in range(requests)]

    async def client_loop(client: httpx.AsyncClient) -> None:
        for index in counter:
            started = time.perf_counter()
            if index % 50 == 49:
                response = await client.get("/models")
            else:
                response = await client.post("/v1/embeddings", json=plan[index][1])
            result.latencies.append(time.perf_counter() - started)
            result.statuses[response.status_code] += 1
            if response.status_code != 200:
                result.errors[response.json()["error"]["message"][:60]] += 1

    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
    result.seconds = time.perf_counter() - started
    return result


class RssSampler:
    """Samples this process's RSS on a thread; `peak` is the highest seen."""

    def __init__(self, period: float = 0.02) -> None:
        self._rss, self.period = process_rss, period
        self.start_rss = self.peak = process_rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.peak = max(self.peak, self._rss())

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth(self) -> int:
        return self.peak - self.start_rss
