"""Batch budgets on the bundled all-MiniLM-L6-v2: the engine in-process at each budget `max_batch_tokens:
auto` tries (its best is the engine at its best batch size), and the server over HTTP with the
device's default budget and with `auto`, in one run.

    .venv/bin/python benchmarks/bench_budget.py [--engines onnx,onnx-int8,...] [--repeats 3]
        [--workloads long,short] [--json OUT]

Per engine, alternating so that every figure sees the same machine, `--repeats` times: the
in-process loop (`lib.engines.InProcess`: tokenized, sorted by length, cut into batches of the
budget) at 512, 1,024, 2,048 and 4,096 tokens, and two servers, one with the default budget and
one with `auto`, each sent 4 clients x 64 documents of ~256 tokens (long) and 4 x 256 STS
sentences (short). Prints inputs/s (medians), each server's ratio to the best in-process budget,
and the budget `auto` chose (from `/v1/models`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
from pathlib import Path
from typing import Any

import httpx

from lib.datasets import long_documents, sts_sentences
from lib.engines import ENGINES, MODEL, InProcess, Served
from lib.machine import cpu

CANDIDATES = (512, 1024, 2048, 4096)


def chosen_budget(server: Served) -> dict[str, Any]:
    models = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]
    entry = next(m for m in models if m["id"] == MODEL)
    budget: dict[str, Any] = entry.get("details", {}).get("batch_budget", {})
    return budget


def measure(engine: dict[str, Any], work: dict[str, list[list[str]]], repeats: int) -> dict[str, Any]:
    runs: dict[str, list[float]] = {}
    with (
        InProcess(engine, "cpu") as local,
        Served(engine, "cpu") as default,
        Served({**engine, "max_batch_tokens": "auto"}, "cpu") as auto,
    ):
        for server in (default, auto):
            server.warm(work)
        budgets = {"default": chosen_budget(default), "auto": chosen_budget(auto)}
        for _ in range(repeats):
            for name, requests in work.items():
                for tokens in CANDIDATES:
                    local.budget = tokens
                    runs.setdefault(f"{name}_in_process_{tokens}", []).append(local.throughput(requests))
                for label, server in (("default", default), ("auto", auto)):
                    runs.setdefault(f"{name}_server_{label}", []).append(server.throughput(name, requests, "base64"))
    medians = {key: statistics.median(values) for key, values in runs.items()}
    return {"budgets": budgets, "medians": medians, "runs": runs}


def report(name: str, figures: dict[str, Any], workloads: list[str]) -> str:
    medians, lines = figures["medians"], []
    auto = figures["budgets"]["auto"]
    lines.append(f"{name}: auto chose {auto.get('tokens')} tokens ({auto.get('chosen_by')})")
    for work in workloads:
        local = {t: medians[f"{work}_in_process_{t}"] for t in CANDIDATES}
        best = max(local, key=lambda t: local[t])
        cells = "  ".join(f"{t}: {v:7.1f}" for t, v in local.items())
        lines.append(f"  {work:5} in-process {cells}  (best {best})")
        for label in ("default", "auto"):
            served = medians[f"{work}_server_{label}"]
            lines.append(f"  {work:5} server {label:7} {served:7.1f} inputs/s = {served / local[best]:.2f} of the best")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="onnx,onnx-int8,ctranslate2-int8,torch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workloads", default="long,short")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rng = random.Random(0)
    short = sts_sentences()
    docs = long_documents(short, 1024, rng)
    pools = {"short": (short, 256), "long": (docs, 64)}
    workloads = args.workloads.split(",")
    work = {name: [rng.sample(pools[name][0], pools[name][1]) for _ in range(4)] for name in workloads}
    results: dict[str, Any] = {"cpu": cpu(), "load_average_before": os.getloadavg()}
    for name in args.engines.split(","):
        results[name] = measure(ENGINES[name], work, args.repeats)
        print(report(name, results[name], workloads), flush=True)
    results["load_average_after"] = os.getloadavg()
    print(json.dumps({"cpu": results["cpu"], "load": [results["load_average_before"], results["load_average_after"]]}))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
