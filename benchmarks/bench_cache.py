"""The result cache's hit ratio and speedup on a workload with repeats, against no cache.

    .venv/bin/python benchmarks/bench_cache.py [--requests 150] [--inputs 8] [--repeat 0.5]
        [--clients 4] [--rounds 2] [--device cpu|cuda]

The bundled all-MiniLM-L6-v2 on torch, in process (`Registry`), twice in one registry: without a
cache and with `cache: {bytes: 64MiB}`. The workload is `--clients` concurrent clients sending
`--requests` requests in all of `--inputs` STS-benchmark sentences each; each sentence is, with
probability `--repeat`, one already sent (drawn uniformly from those), else a new one. The same
workload runs through both entries, alternating, `--rounds` times, with an empty cache each round.
Prints per round and as medians: inputs/s of each, their ratio, the cache's hit ratio (distinct
inputs found over those looked up), and the largest difference between the two runs' vectors
(batch composition only); then the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from typing import Any

import numpy as np

from lib.datasets import sts_sentences
from lib.engines import SOURCE
from lib.machine import cpu
from model_registry import Registry
from model_registry.cache import results as result_cache


def workload(sentences: list[str], requests: int, inputs: int, repeat: float, rng: random.Random) -> list[list[str]]:
    fresh, seen, batches = iter(sentences), list[str](), list[list[str]]()
    for _ in range(requests):
        batch = []
        for _ in range(inputs):
            sentence = rng.choice(seen) if seen and rng.random() < repeat else next(fresh)
            seen.append(sentence)
            batch.append(sentence)
        batches.append(batch)
    return batches


async def run(registry: Registry, model: str, batches: list[list[str]], clients: int) -> tuple[float, list[Any]]:
    """Seconds for every batch, `clients` at a time, and the vectors in batch order."""
    results: list[Any] = [None] * len(batches)
    next_index = iter(range(len(batches)))

    async def client() -> None:
        for i in next_index:
            results[i] = await registry.embed(model, batches[i])

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return time.perf_counter() - started, [v for r in results for v in r.items]


def largest_difference(a: list[Any], b: list[Any]) -> float:
    """The largest element difference between two runs' vectors (batches differ between runs, so
    padding may move the last bits; a hit equals the vector its own miss computed)."""
    return max(float(np.abs(x.dense - y.dense).max()) for x, y in zip(a, b, strict=True))


async def round_(args: argparse.Namespace, batches: list[list[str]]) -> dict[str, float]:
    entry = {"source": SOURCE, "backend": "torch", "device": args.device}
    config = {"models": [{"name": "plain", **entry}, {"name": "cached", **entry, "cache": {"bytes": "64MiB"}}]}
    async with Registry.from_config(config) as registry:
        for model in ("plain", "cached"):
            await registry.load(model)
            await registry.embed(model, ["warm up"])
        plain_seconds, computed = await run(registry, "plain", batches, args.clients)
        with result_cache.recording() as lookups:
            cached_seconds, cached = await run(registry, "cached", batches, args.clients)
    inputs = sum(len(b) for b in batches)
    hits, misses = sum(x.hits for x in lookups), sum(x.misses for x in lookups)
    return {
        "inputs": inputs,
        "plain": inputs / plain_seconds,
        "cached": inputs / cached_seconds,
        "speedup": plain_seconds / cached_seconds,
        "hit_ratio": hits / (hits + misses),
        "difference": largest_difference(computed, cached),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--inputs", type=int, default=8)
    parser.add_argument("--repeat", type=float, default=0.5, help="chance that an input is one already sent")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    sentences = sts_sentences()
    random.Random(0).shuffle(sentences)
    batches = workload(sentences, args.requests, args.inputs, args.repeat, random.Random(1))
    rounds = []
    for i in range(args.rounds):
        found = asyncio.run(round_(args, batches))
        rounds.append(found)
        print(
            f"round {i + 1}: no cache {found['plain']:.0f} inputs/s, cache {found['cached']:.0f} inputs/s, "
            f"speedup {found['speedup']:.2f}x, hit ratio {found['hit_ratio']:.3f}, "
            f"largest difference to no cache {found['difference']:.1e}"
        )
    medians = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print(
        f"median: no cache {medians['plain']:.0f} inputs/s, cache {medians['cached']:.0f} inputs/s, "
        f"speedup {medians['speedup']:.2f}x, hit ratio {medians['hit_ratio']:.3f}"
    )
    print(f"machine: {cpu()}")


if __name__ == "__main__":
    main()
