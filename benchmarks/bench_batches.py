"""What the server's batches look like under a bulk load: how many, how full, how busy the forward
thread is, and how long the garbage collector stopped the server, read from its own `/metrics`.

    .venv/bin/python benchmarks/bench_batches.py [--device cpu|cuda] [--engines torch,onnx,...]
        [--clients 4,16] [--requests 64] [--inputs 256] [--stand-in SECONDS_PER_TOKEN]
        [--stand-in-ops N] [--stand-in-width N] [--freeze on|off|both]
        [--gc-thresholds 700,10,10/50000,10,10]
        [--switch-interval 0.005/0.0005] [--rounds 1] [--workload short|long] [--profile DIR]

For each engine, the bundled all-MiniLM-L6-v2 served by `infinity-server serve` (a subprocess) and
the same engine in-process (`lib/engines.py`'s `InProcess`, the ceiling): `--requests` requests of
`--inputs` short STS-benchmark sentences from each number of concurrent clients, with `/metrics`
read before and after. Reported per run: inputs/s and its ratio to the in-process figure, the
batches run, items per batch, the mean batch fill (cost over the token budget), the forward
thread's busy share of the wall time (the sum of `infinity_batch_seconds` over the run's length),
the garbage collector's pauses (`infinity_gc_pause_seconds`) and the per-request stage sums,
then the run as one JSON record (`{"device", "engine", "workload", "clients",
"server_inputs_per_s", "in_process_inputs_per_s", "server_per_in_process"}`, the shape of
`docs/runs/`). `--workload long` sends documents of about 250 tokens instead of sentences.
`--profile DIR` profiles ten batches of each, in the server and in-process, with torch.profiler
(`lib/profiling.py`): `DIR/server-<engine>-<workload>-<model>.txt` and
`DIR/in-process-<engine>-<workload>.txt`.

`--stand-in S` runs the ONNX Runtime engine as a stand-in for a fast device (`lib/standin.py`): S
seconds per padded token with the interpreter lock released, in the server and in-process alike,
with the GPU's token budget per batch; with `--stand-in-ops N` each batch first launches N
operations one at a time, each releasing the lock and taking it back, as eager torch does on a GPU,
and with `--stand-in-width 384` it hands back hidden states of MiniLM's width, which the server
pools on the host (8 by default: pooling next to free).
`--freeze off` runs the server with `gc.freeze` disabled, to measure what `model_registry.runtime.heap`'s
freeze of loaded models buys; `both` alternates the two `--rounds` times. `--gc-thresholds` runs
the server with each of the given collector thresholds in turn (`gc.set_threshold`'s arguments,
settings separated by "/"; the default is CPython's own), and `--switch-interval` with each of the
given interpreter switch intervals in seconds (`sys.setswitchinterval`; the default is the
server's own).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import re
import statistics
from pathlib import Path
from typing import Any

import httpx

from lib.clients import bulk
from lib.datasets import long_documents, sts_sentences
from lib.engines import BATCH_TOKENS, ENGINES, InProcess, Served
from lib.machine import record_device

HERE = Path(__file__).resolve().parent


def scrape(url: str) -> dict[str, float]:
    """The counters, histogram sums and counts of `/metrics`; stage and generation sums keyed
    `name:stage` and `name:generation`."""
    found: dict[str, float] = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        match = re.match(r"(infinity_[a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if not match or not match.group(1).endswith(("_total", "_sum", "_count")):
            continue
        label = re.search(r'(?:stage|generation)="(\w+)"', match.group(2) or "")
        key = match.group(1) + (":" + label.group(1) if label else "")
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
        "gc_pauses": {
            g: (
                delta.get(f"infinity_gc_pause_seconds_count:{g}", 0.0),
                delta.get(f"infinity_gc_pause_seconds_sum:{g}", 0.0),
            )
            for g in "012"
        },
        "stage_sums_s": {
            key.split(":")[1]: round(value, 3)
            for key, value in delta.items()
            if key.startswith("infinity_stage_seconds_sum:")
        },
    }


def serving(engine: dict[str, Any], device: str, freeze: bool, thresholds: str | None, interval: str | None) -> Served:
    for name in ("BENCH_WITHOUT_FREEZE", "BENCH_GC_THRESHOLDS", "BENCH_SWITCH_INTERVAL"):
        os.environ.pop(name, None)
    if not freeze:
        os.environ["BENCH_WITHOUT_FREEZE"] = "1"
    if thresholds:
        os.environ["BENCH_GC_THRESHOLDS"] = thresholds
    if interval:
        os.environ["BENCH_SWITCH_INTERVAL"] = interval
    return Served(engine, device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--engines", default="torch,onnx,ctranslate2")
    parser.add_argument("--clients", default="4,16")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--inputs", type=int, default=256)
    parser.add_argument("--stand-in", type=float, metavar="SECONDS_PER_TOKEN", help="a fast device's stand-in")
    parser.add_argument("--stand-in-ops", type=int, default=0, help="operations launched one at a time per batch")
    parser.add_argument(
        "--stand-in-width", type=int, default=8, help="the stand-in's hidden state width (384: MiniLM's)"
    )
    parser.add_argument("--freeze", choices=("on", "off", "both"), default="on")
    parser.add_argument("--gc-thresholds", help="the server's collector thresholds, settings separated by /")
    parser.add_argument("--switch-interval", help="the server's interpreter switch intervals (s), separated by /")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each server (alternating with --freeze both)")
    parser.add_argument("--workload", choices=("short", "long"), default="short")
    parser.add_argument("--profile", type=Path, metavar="DIR", help="torch.profiler tables of ten batches each")
    args = parser.parse_args()
    rng = random.Random(0)
    texts = sts_sentences()
    if args.workload == "long":
        texts = long_documents(texts, 1024, rng)
    requests = [rng.sample(texts, args.inputs) for _ in range(args.requests)]
    device = record_device(args.device)
    # The server imports the hooks (hooks/sitecustomize.py, which imports lib/standin.py) at start.
    paths = [str(HERE / "hooks"), str(HERE), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    engines = args.engines.split(",")
    if args.stand_in is not None:
        from lib import standin

        standin.stand_in(args.stand_in, args.stand_in_ops, args.stand_in_width)
        os.environ["BENCH_STAND_IN"] = repr(args.stand_in)
        os.environ["BENCH_STAND_IN_OPS"] = str(args.stand_in_ops)
        os.environ["BENCH_STAND_IN_WIDTH"] = str(args.stand_in_width)
        BATCH_TOKENS[args.device] = BATCH_TOKENS["cuda"]
        engines = ["onnx"]
    freezes = {"on": [True], "off": [False], "both": [True, False]}[args.freeze]
    settings = args.gc_thresholds.split("/") if args.gc_thresholds else [None]
    intervals = args.switch_interval.split("/") if args.switch_interval else [None]
    for name in engines:
        engine = {**ENGINES[name], "max_batch_tokens": BATCH_TOKENS[args.device]}
        window = None
        if args.profile is not None:
            from lib.profiling import Window

            os.environ["BENCH_PROFILE"] = str(args.profile.resolve())
            os.environ["BENCH_PROFILE_NAME"] = f"server-{name}-{args.workload}"
            window = Window(args.profile, f"in-process-{name}-{args.workload}")
        with InProcess(engine, args.device, window) as local:
            local.throughput(requests[:4])
            ceiling = statistics.median(local.throughput(requests) for _ in range(3))
            print(f"{name}: in-process {ceiling:.0f} inputs/s (median of 3)", flush=True)
        for round_ in range(args.rounds):
            for freeze, thresholds, interval in itertools.product(freezes, settings, intervals):
                with serving(engine, args.device, freeze, thresholds, interval) as server:
                    asyncio.run(bulk(server.url, "warm", requests[:8], clients=1, encoding_format="base64"))
                    for clients in (int(c) for c in args.clients.split(",")):
                        figures = run(server, requests, clients)
                        pauses = ", ".join(
                            f"gen {g}: {n:.0f} in {1e3 * seconds:.0f} ms"
                            for g, (n, seconds) in figures["gc_pauses"].items()
                        )
                        print(
                            f"  round {round_ + 1}, freeze {'on' if freeze else 'off'}"
                            f"{f', thresholds {thresholds}' if thresholds else ''}"
                            f"{f', switch interval {interval}' if interval else ''}, {clients} clients: "
                            f"{figures['inputs_per_s']:.0f} inputs/s ({figures['inputs_per_s'] / ceiling:.2f} of "
                            f"in-process), {figures['batches']:.0f} batches of {figures['items_per_batch']:.0f} items, "
                            f"fill {figures['fill']:.2f}, forward thread busy {100 * figures['forward_busy']:.0f}%, "
                            f"collector pauses {pauses}; per-request stage sums {figures['stage_sums_s']}",
                            flush=True,
                        )
                        record = {
                            "device": device,
                            "engine": name,
                            "workload": args.workload,
                            "clients": clients,
                            "server_inputs_per_s": round(figures["inputs_per_s"], 1),
                            "in_process_inputs_per_s": round(ceiling, 1),
                            "server_per_in_process": round(figures["inputs_per_s"] / ceiling, 3),
                        }
                        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
