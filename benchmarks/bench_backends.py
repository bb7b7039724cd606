"""Engines side by side on the bundled all-MiniLM-L6-v2: the server over HTTP, the same engine
in-process (the ceiling), and sentence-transformers `encode`, all in one run.

    .venv/bin/python benchmarks/bench_backends.py [--requests-per-client N] [--short-inputs N]
        [--long-inputs N] [--repeats N] [--encoding-format base64|float] [--engines torch,onnx,...]
        [--device cpu|cuda] [--json OUT] [--quality-only] [--report OUT]

For each engine (torch, onnx, onnx int8, ctranslate2, ctranslate2 int8), with the engine loaded in
this process and served by `infinity-server serve` (one model, a subprocess) at the same time:
1. throughput, `--repeats` times, in-process and over HTTP alternately so that both see the same
   machine (on a shared virtual machine one run swings by 10-20%; the medians are reported, every
   run is kept in `--json`):
   - over HTTP: 4 clients x 256 short STS-benchmark sentences and 4 x 64 documents of ~256
     tokens, one request each, inputs/s; the clients ask for base64 vectors and decode them into
     numpy arrays, as the openai client does by default (`--encoding-format float` for JSON
     numbers);
   - in-process: the same adapter and engine on the same inputs, tokenized, sorted by length and
     cut into batches of the server's token budget, with the heap frozen after the load and the
     thread that runs `forward` set up as the server does both: the ceiling the server can reach;
     the ratio server / in-process is the server's overhead;
2. idle latency: single sentences one at a time over HTTP with a bare keep-alive client
   (`lib.serving.KeepAlive`: from the request's first byte to the response's last, parsed
   after), each followed by `IDLE_GAP`, a `/health` round trip (the HTTP floor) and `IDLE_GAP`
   again, in blocks alternating with the engine's own single-sentence prepare + forward +
   postprocess in-process at the same pace: p50s, and the server's stage times from its timing
   headers. An idle engine's thread pool sleeps between requests and wakes on the next one, so
   the idle forward is the reference for the server's idle latency. Then the standard library's
   `http.client` (which adds its own response parsing to the figure) and httpx's async client
   alone, and the engine in-process back to back (hot).
sentence-transformers `encode(batch_size=32)` on the same inputs is the naive baseline. Converted
models are cached (the user's engine cache), so only the first run exports. The CPU's model and
vector extensions, the load average and the hypervisor's steal time are printed with the figures:
int8 speed depends on VNNI/AVX-512.

`--device cuda` runs every engine on the GPU in its half-precision default (torch, onnx and
ctranslate2 in float16, ctranslate2 int8 as int8_float16; onnx int8 is CPU only), with the
server's GPU token budget per batch, and sentence-transformers in float16 on the GPU as the
baseline; the GPU's name is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from lib.datasets import long_documents, sts_rows, sts_sentences
from lib.engines import ENGINES, IDLE_GAP, SOURCE, STAGES, InProcess, Served, adapter_for
from lib.machine import cpu, gpu, steal
from lib.serving import KeepAlive

#: Engines that run on CPUs only.
CPU_ONLY = {"onnx-int8"}
#: Seconds of quiet before each block of idle probes, and the probes of a block not counted.
BLOCK_PAUSE = 0.2
WARM_PROBES = 2


def idle(server: Served, local: InProcess, probes: list[str], rounds: int = 5) -> dict[str, float]:
    """The server and the engine in-process in alternating blocks of single sentences: over HTTP,
    each followed by `IDLE_GAP`, a `/health` round trip (the HTTP floor) and `IDLE_GAP` again;
    then in-process, each followed by a pause as long as the server's engine was idle before the
    next probe (from one probe's start to the next, less the probe's inference time), so that the
    engine sleeps as long between its forward passes on both sides: on a 2-core VM a torch pass
    after 40 ms idle took 8 ms and one after 45-50 ms took 18, so a few milliseconds more idle on
    one side decided its figure. p50s in ms over every block, and the server's stage times from
    its timing headers.

    Blocks, not strict turns, and a pause between them: an OpenMP engine's threads spin for
    10-20 ms after each forward pass (measured here), so a probe 20 ms after the other process's
    forward pass would pay for that process's spinning (torch in-process: 9 ms alone, 13 ms in
    strict turns with the server). Blocks still put both sides in the same minute of the machine,
    whose idle figures drift by several ms between runs."""
    connection = KeepAlive("127.0.0.1", server.port)
    served: list[float] = []
    local_runs: list[float] = []
    floor: list[float] = []
    stages: dict[str, list[float]] = {stage: [] for stage in STAGES}
    size = max(1, len(probes) // rounds)
    try:
        for start in range(0, size * rounds, size):
            block = probes[start : start + size]
            pauses = []
            time.sleep(BLOCK_PAUSE)
            for i, text in enumerate(block):
                started = time.perf_counter()
                seconds, headers = server.idle(text, connection)
                time.sleep(IDLE_GAP)
                health = server.health(connection)
                time.sleep(IDLE_GAP)
                pauses.append(max(0.0, time.perf_counter() - started - headers["inference"] / 1e3))
                if i >= WARM_PROBES:
                    served.append(seconds)
                    floor.append(health)
                    for stage, value in headers.items():
                        stages[stage].append(value)
            time.sleep(BLOCK_PAUSE)
            for i, (text, pause) in enumerate(zip(block, pauses, strict=True)):
                seconds = local.single(text)
                time.sleep(pause)  # the engine idles as long as the server's did between its probes
                if i >= WARM_PROBES:
                    local_runs.append(seconds)
    finally:
        connection.close()
    figures = {
        "idle_p50_ms": statistics.median(served) * 1e3,
        "single_idle_p50_ms": statistics.median(local_runs) * 1e3,
        "health_p50_ms": statistics.median(floor) * 1e3,
    }
    return figures | {f"server_{stage}_p50_ms": statistics.median(values) for stage, values in stages.items()}


def measure(
    engine: dict[str, Any],
    work: dict[str, list[list[str]]],
    probes: list[str],
    repeats: int,
    encoding_format: str,
    device: str,
) -> dict[str, Any]:
    """In-process and over HTTP alternately, `repeats` times each, so both see the same machine;
    medians, with every run kept."""
    runs: dict[str, list[float]] = {}
    stolen, total = steal()
    with InProcess(engine, device) as local, Served(engine, device) as server:
        server.warm(work)
        local.hot(probes[:8])
        local.throughput([requests[0][:64] for requests in work.values()])
        for _ in range(repeats):
            for name, requests in work.items():
                runs.setdefault(f"{name}_in_process", []).append(local.throughput(requests))
                runs.setdefault(f"{name}_server", []).append(server.throughput(name, requests, encoding_format))
        figures: dict[str, Any] = idle(server, local, probes)
        figures["idle_stdlib_p50_ms"] = server.idle_stdlib(probes)
        figures["idle_httpx_p50_ms"] = server.idle_httpx(probes)
        figures["single_hot_p50_ms"] = local.hot(probes)
    stolen_after, total_after = steal()
    figures |= {key: statistics.median(values) for key, values in runs.items()}
    figures["runs"] = runs
    figures["steal_percent"] = 100 * (stolen_after - stolen) / max(1, total_after - total)
    return figures


def quality(engine: dict[str, Any], reference: Any, device: str) -> dict[str, float]:
    """STS-benchmark test sentences on `engine` against sentence-transformers fp32: mean and worst
    cosine, and the Spearman correlation with the gold scores (and its drop)."""
    import numpy as np
    from scipy.stats import spearmanr

    from model_registry.types import EmbedItem, Text

    rows = sts_rows()
    texts = sorted({s for a, b, _ in rows for s in (a, b)})
    adapter, options = adapter_for(engine, device)
    adapter.load(options)
    vectors = []
    for i in range(0, len(texts), 64):
        collated = adapter.collate(adapter.prepare([EmbedItem(Text(t)) for t in texts[i : i + 64]]))
        vectors += [r.dense for r in adapter.postprocess(collated, adapter.forward(collated))]  # type: ignore[union-attr]
    adapter.unload()
    ours, theirs = np.asarray(vectors), reference.encode(texts, batch_size=32)
    cosines = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    index = {t: i for i, t in enumerate(texts)}
    gold = [g for _, _, g in rows]

    def spearman(v: Any) -> float:
        return float(spearmanr([float(v[index[a]] @ v[index[b]]) for a, b, _ in rows], gold).statistic)

    return {
        "mean_cosine": float(cosines.mean()),
        "worst_cosine": float(cosines.min()),
        "spearman": spearman(ours),
        "spearman_drop": spearman(theirs) - spearman(ours),
    }


def sentence_transformers(work: dict[str, list[list[str]]], device: str) -> dict[str, float]:
    from sentence_transformers import SentenceTransformer

    from model_registry.zoo.sources import resolve_source

    model = SentenceTransformer(str(resolve_source(SOURCE)), device=device)
    if device == "cuda":
        model.half()  # the engines run in float16 on the GPU
    figures = {}
    for name, requests in work.items():
        texts = [t for request in requests for t in request]
        model.encode(texts[:64], batch_size=32)
        started = time.perf_counter()
        model.encode(texts, batch_size=32)
        figures[f"{name}_inputs_per_s"] = len(texts) / (time.perf_counter() - started)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests-per-client", type=int, default=1)
    parser.add_argument("--short-inputs", type=int, default=256, help="inputs per short request")
    parser.add_argument("--long-inputs", type=int, default=64, help="inputs per long request")
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of each workload, alternating (0: idle latency only)"
    )
    parser.add_argument("--probes", type=int, default=150, help="single sentences for idle latency (5 blocks)")
    parser.add_argument(
        "--encoding-format",
        choices=("base64", "float"),
        default="base64",
        help="how the bulk clients ask for vectors (the openai client asks for base64 by default)",
    )
    parser.add_argument("--engines", help="comma-separated (default: every engine the device runs)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--quality-only", action="store_true", help="only the STS-b quality of each engine")
    parser.add_argument("--report", type=Path, help="print the table of an earlier run's --json and stop")
    args = parser.parse_args()
    if args.report:
        print(report(json.loads(args.report.read_text())))
        return
    engines = args.engines.split(",") if args.engines else [e for e in ENGINES if runs_here(e, args.device)]
    rng = random.Random(0)
    short = sts_sentences()
    docs = long_documents(short, 1024, rng)
    count = 4 * args.requests_per_client
    work = {
        "short": [rng.sample(short, args.short_inputs) for _ in range(count)],
        "long": [rng.sample(docs, args.long_inputs) for _ in range(count)],
    }
    probes = rng.sample(short, args.probes)
    if args.quality_only:
        from sentence_transformers import SentenceTransformer

        from model_registry.zoo.sources import resolve_source

        reference = SentenceTransformer(str(resolve_source(SOURCE)), device="cpu")
        for name in engines:
            print(name, json.dumps(quality(ENGINES[name], reference, args.device)), flush=True)
        return
    results: dict[str, Any] = {
        "cpu": cpu(),
        "device": args.device,
        "gpu": gpu() if args.device == "cuda" else None,
        "encoding_format": args.encoding_format,
        "load_average_before": os.getloadavg(),
    }
    results["sentence-transformers"] = sentence_transformers(work, args.device) if args.repeats else {}
    print("sentence-transformers", json.dumps(results["sentence-transformers"]), flush=True)
    for name in engines:
        results[name] = measure(ENGINES[name], work, probes, args.repeats, args.encoding_format, args.device)
        print(name, json.dumps(results[name]), flush=True)
    results["load_average_after"] = os.getloadavg()
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def runs_here(engine: str, device: str) -> bool:
    """Whether the default run measures `engine` on `device`: bfloat16 on a CPU only where it has
    bfloat16 instructions (on CUDA the engines run float16 anyway)."""
    if device != "cpu":
        return engine not in CPU_ONLY and engine != "torch-bf16"
    from model_registry.backends.choice import cpu_flags

    return engine != "torch-bf16" or bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def paired_ratio(runs: dict[str, list[float]], work: str) -> float:
    """The median of server / in-process over each repeat's pair of runs (taken one after the
    other), which a slow drift of the machine during the block moves less than a ratio of medians."""
    pairs = zip(runs[f"{work}_server"], runs[f"{work}_in_process"], strict=True)
    return statistics.median(served / local for served, local in pairs)


def report(results: dict[str, Any]) -> str:
    st = results["sentence-transformers"]
    lines = [
        f"CPU: {results['cpu']}; bulk responses as {results['encoding_format']}",
        *([f"GPU: {results['gpu']}; every engine in its half-precision default"] if results.get("gpu") else []),
        "",
        "| engine | short: server | in-process | server/in-process (paired) | x s-t | long: server | in-process "
        "| server/in-process (paired) | x s-t | steal % |",
        "|" + "---|" * 10,
    ]
    short, long = st.get("short_inputs_per_s"), st.get("long_inputs_per_s")
    if short is not None and long is not None:
        lines.append(f"| sentence-transformers | | {short:.0f} | | 1.00 | | {long:.1f} | | 1.00 | |")
    engines = {name: v for name, v in results.items() if isinstance(v, dict) and "idle_p50_ms" in v}
    for name, value in engines.items():
        if not value["runs"] or short is None or long is None:
            continue
        cells = []
        for work in ("short", "long"):
            served, local = value[f"{work}_server"], value[f"{work}_in_process"]
            cells += [
                f"{served:.1f}",
                f"{local:.1f}",
                f"{paired_ratio(value['runs'], work):.2f}",
                f"{served / st[f'{work}_inputs_per_s']:.2f}",
            ]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {value['steal_percent']:.1f} |")
    lines += [
        "",
        "Idle single sentences, server and in-process in alternating blocks (p50 ms); "
        "the server's stages from its timing headers:",
        "",
        "| engine | server over HTTP | engine in-process, idle | difference (target <= 2) | hot in-process "
        "| http.client | httpx client | /health | server: total | tokenization | queue | inference |",
        "|" + "---|" * 12,
    ]
    for name, value in engines.items():
        if "health_p50_ms" not in value:  # a saved run without the /health floor has no idle table
            continue
        served, local = value["idle_p50_ms"], value["single_idle_p50_ms"]
        stages = " | ".join(f"{value[f'server_{stage}_p50_ms']:.2f}" for stage in STAGES)
        stdlib = value.get("idle_stdlib_p50_ms")  # absent from saved runs that probed with http.client alone
        lines.append(
            f"| {name} | {served:.2f} | {local:.2f} | {served - local:+.2f} | {value['single_hot_p50_ms']:.2f} "
            f"| {'' if stdlib is None else f'{stdlib:.2f}'} | {value['idle_httpx_p50_ms']:.2f} "
            f"| {value['health_p50_ms']:.2f} | {stages} |"
        )
    lines.append(f"\nload average before {results['load_average_before']}, after {results['load_average_after']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
