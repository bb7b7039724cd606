"""What the server's batches look like under a bulk load: how many, how full, how busy the forward
thread is, read from its own `/metrics`.

    .venv/bin/python benchmarks/bench_batches.py [--device cpu|cuda] [--engines torch,onnx,...]
        [--clients 4,16] [--requests 64] [--inputs 256]

For each engine, the bundled all-MiniLM-L6-v2 served by `infinity-server serve` (a subprocess) and
the same engine in-process (bench_backends' `InProcess`, the ceiling): `--requests` requests of
`--inputs` short STS-benchmark sentences from each number of concurrent clients, with `/metrics`
read before and after. Reported per run: inputs/s, the batches run, items per batch, the mean
batch fill (cost over the token budget), the forward thread's busy share of the wall time (the sum
of `infinity_batch_seconds` over the run's length) and the per-request stage sums.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
from typing import Any

import httpx

from bench_backends import ENGINES, InProcess, Served
from bench_embeddings import bulk, sentences


def scrape(url: str) -> dict[str, float]:
    """The counters, histogram sums and counts of `/metrics`, stage sums keyed `name:stage`."""
    found: dict[str, float] = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        match = re.match(r"(infinity_[a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if not match or not match.group(1).endswith(("_total", "_sum", "_count")):
            continue
        stage = re.search(r'stage="(\w+)"', match.group(2) or "")
        key = match.group(1) + (":" + stage.group(1) if stage else "")
        found[key] = found.get(key, 0.0) + float(match.group(3))
    return found


def run(server: Served, requests: list[list[str]], clients: int) -> dict[str, Any]:
    before = scrape(server.url)
    result = asyncio.run(bulk(server.url, "batches", requests, clients=clients, encoding_format="base64"))
    after = scrape(server.url)
    delta = {key: value - before.get(key, 0.0) for key, value in after.items()}
    batches = delta.get("infinity_batch_seconds_count", 0.0)
    busy = delta.get("infinity_batch_seconds_sum", 0.0)
    return {
        "clients": clients,
        "inputs_per_s": result.inputs_per_s,
        "batches": batches,
        "items_per_batch": delta.get("infinity_batch_items_total", 0.0) / max(batches, 1.0),
        "fill": delta.get("infinity_batch_fill_sum", 0.0) / max(batches, 1.0),
        "forward_busy": busy / result.seconds,
        "stage_sums_s": {
            key.split(":")[1]: round(value, 3)
            for key, value in delta.items()
            if key.startswith("infinity_stage_seconds_sum:")
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--engines", default="torch,onnx,ctranslate2")
    parser.add_argument("--clients", default="4,16")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--inputs", type=int, default=256)
    args = parser.parse_args()
    rng = random.Random(0)
    short = sentences()
    requests = [rng.sample(short, args.inputs) for _ in range(args.requests)]
    for name in args.engines.split(","):
        engine = ENGINES[name]
        with Served(engine, args.device) as server, InProcess(engine, args.device) as local:
            asyncio.run(bulk(server.url, "warm", requests[:8], clients=1, encoding_format="base64"))
            local.throughput(requests[:4])
            print(f"{name}: in-process {[round(local.throughput(requests)) for _ in range(2)]} inputs/s", flush=True)
            for clients in (int(c) for c in args.clients.split(",")):
                figures = run(server, requests, clients)
                print(
                    f"  {clients} clients: {figures['inputs_per_s']:.0f} inputs/s, {figures['batches']:.0f} batches "
                    f"of {figures['items_per_batch']:.0f} items, fill {figures['fill']:.2f}, forward thread busy "
                    f"{100 * figures['forward_busy']:.0f}%, per-request stage sums {figures['stage_sums_s']}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
