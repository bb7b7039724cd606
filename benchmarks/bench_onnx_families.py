"""torch against ONNX Runtime (fp32 and int8), family by family, in process, on this machine.

    python benchmarks/bench_onnx_families.py [--families modernbert,nomic_bert,qwen3,gemma3_text,
        jina_embeddings_v3] [--rounds 5] [--work DIR] [--json out.json]

Each architecture is built at the size of its smallest published embedder, with random weights
(speed does not depend on their values): ModernBERT-base (gte-modernbert-base,
modernbert-embed-base), nomic-embed-text-v1.5, Qwen3-Embedding-0.6B, EmbeddingGemma-300m and
jina-embeddings-v3 (its five task adapters beside the weights, every batch run with the first),
their shapes written out below. Each is exported once into `--work` (kept between runs), then every
engine runs two batches of random token ids: `short`, 16 sentences of 8-24 tokens, and `long`, 2
documents of 256 tokens; a decoder's rows are padded on the left. The rounds alternate the
engines so that each meets the same machine. Prints a JSON record per family, engine and batch,
then a Markdown table: the median real tokens/s of each engine and each ONNX Runtime engine's
speed over torch's, as the median and the range of the rounds' paired ratios, with the CPU and
the load average over the family's rounds (torch's OpenMP threads lose most where other
processes take the cores: run it on a quiet machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from lib.machine import cpu, steal
from model_registry.backends.base import EncoderBatch, Engine, EngineOptions

#: architecture -> (transformers config class, the published shape). ModernBertConfig's and
#: NomicBertConfig's defaults are ModernBERT-base's and nomic-embed-text-v1.5's.
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "modernbert": ("ModernBertConfig", {}),
    "nomic_bert": ("NomicBertConfig", {}),
    "qwen3": (
        "Qwen3Config",
        {
            "vocab_size": 151669,
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": True,
        },
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        {
            "vocab_size": 262144,
            "hidden_size": 768,
            "intermediate_size": 1152,
            "num_hidden_layers": 24,
            "num_attention_heads": 3,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "max_position_embeddings": 2048,
            "sliding_window": 512,
            "query_pre_attn_scalar": 256,
            "use_bidirectional_attention": True,
        },
    ),
    # jina-embeddings-v3 as its view lays it out: the port's weights, the five task adapters apart
    "jina_embeddings_v3": (
        "JinaEmbeddingsV3Config",
        {
            "vocab_size": 250002,
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "max_position_embeddings": 8194,
            "pad_token_id": 1,
            "rope_parameters": {"rope_type": "default", "rope_theta": 20000.0},
            "lora_adaptations": [
                "retrieval.query",
                "retrieval.passage",
                "separation",
                "classification",
                "text-matching",
            ],
            "lora_rank": 4,
            "lora_alpha": 1,
        },
    ),
}
DECODERS = frozenset({"qwen3"})
#: Architectures whose batches run with a task adapter (the first task's, on every engine).
ADAPTED = frozenset({"jina_embeddings_v3"})
ENGINES = ("torch", "onnx-fp32", "onnx-int8")


def build(architecture: str, work: Path) -> Path:
    """The random model of `architecture` in `work`, written once."""
    import torch
    import transformers

    directory = work / architecture
    if (directory / "config.json").is_file():
        return directory
    name, shape = SHAPES[architecture]
    torch.manual_seed(0)
    config = getattr(transformers, name)(**shape)
    model = transformers.AutoModel.from_config(config).eval()
    model.save_pretrained(directory)
    if architecture in ADAPTED:
        save_adapters(model, directory)
    return directory


def save_adapters(model: Any, directory: Path) -> None:
    """Random task adapters for every layer of the port, under the published checkpoint's names."""
    from safetensors.torch import save_file
    from tests.builders.jina import adapter_tensors, lora_factors

    from model_registry.backends.base import LORA_FILE

    config = model.config
    factors = lora_factors(model, tasks=len(config.lora_adaptations), rank=config.lora_rank, scale=0.01)
    save_file(adapter_tensors(factors), str(directory / LORA_FILE))


def batch(rows: int, low: int, high: int, left: bool, seed: int = 0, task: int | None = None) -> EncoderBatch:
    """Random ids in [10, 1000), `rows` of `low`-`high` real tokens, padded on `left` or right;
    `task`: the task adapter it runs with."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(low, high + 1, size=rows)
    width = int(lengths.max())
    ids = np.zeros((rows, width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, length in enumerate(lengths):
        span = slice(width - length, width) if left else slice(0, length)
        ids[row, span] = rng.integers(10, 1000, size=length)
        mask[row, span] = 1
    return EncoderBatch(ids, mask, task_id=task)


def load(engine: str, directory: Path, work: Path) -> Engine:
    from model_registry.backends.base import LORA_FILE
    from model_registry.backends.onnx.engine import OnnxEngine
    from model_registry.backends.torch.engine import TorchEngine

    loaded: Engine = TorchEngine() if engine == "torch" else OnnxEngine()
    quantize = "int8" if engine == "onnx-int8" else "none"
    started = time.monotonic()
    loaded.load(directory, EngineOptions(device="cpu", quantize=quantize, cache_dir=str(work / "cache")))
    if isinstance(loaded, TorchEngine) and (directory / LORA_FILE).is_file():
        from model_registry.backends.torch import lora

        tasks, rank, alpha = lora.settings(loaded.model.config.to_dict())
        factors = lora.read_factors(directory / LORA_FILE)
        lora.install(loaded.model, factors, (len(tasks), rank), alpha / rank).task = 0
    print(f"# {directory.name} on {engine}: loaded in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return loaded


def seconds(engine: Engine, inputs: EncoderBatch) -> float:
    started = time.perf_counter()
    engine.run(inputs)
    return time.perf_counter() - started


def measure(architecture: str, work: Path, rounds: int) -> dict[str, dict[str, list[float]]]:
    """engine -> batch -> seconds per round, the engines alternating within each round."""
    directory = build(architecture, work)
    left, task = architecture in DECODERS, 0 if architecture in ADAPTED else None
    batches = {"short": batch(16, 8, 24, left, task=task), "long": batch(2, 256, 256, left, task=task)}
    engines = {name: load(name, directory, work) for name in ENGINES}
    for engine in engines.values():
        for inputs in batches.values():
            engine.run(inputs)  # warm-up
    times: dict[str, dict[str, list[float]]] = {e: {b: [] for b in batches} for e in engines}
    for _ in range(rounds):
        for name, engine in engines.items():
            for label, inputs in batches.items():
                times[name][label].append(seconds(engine, inputs))
    for engine in engines.values():
        engine.release()
    return times


def records(
    architecture: str, times: dict[str, dict[str, list[float]]], tokens: dict[str, int]
) -> list[dict[str, Any]]:
    found = []
    for engine, by_batch in times.items():
        for label, runs in by_batch.items():
            ratios = [t / o for t, o in zip(times["torch"][label], runs, strict=True)]
            found.append(
                {
                    "family": architecture,
                    "engine": engine,
                    "batch": label,
                    "tokens_per_s": round(tokens[label] / statistics.median(runs), 1),
                    "over_torch": round(statistics.median(ratios), 3),
                    "over_torch_range": [round(min(ratios), 3), round(max(ratios), 3)],
                }
            )
    return found


def table(found: list[dict[str, Any]]) -> str:
    lines = [
        "| family | batch | torch tokens/s | onnx fp32 tokens/s | over torch | onnx int8 tokens/s | over torch"
        " | load |",
        "|---|---|---:|---:|---|---:|---|---:|",
    ]
    index = {(r["family"], r["engine"], r["batch"]): r for r in found}
    for family, label in dict.fromkeys((r["family"], r["batch"]) for r in found):
        cells = [family, label, f"{index[family, 'torch', label]['tokens_per_s']:,.0f}"]
        for engine in ("onnx-fp32", "onnx-int8"):
            record = index[family, engine, label]
            low, high = record["over_torch_range"]
            cells += [f"{record['tokens_per_s']:,.0f}", f"{record['over_torch']:.2f}x ({low:.2f}-{high:.2f})"]
        cells.append(str(index[family, "torch", label].get("load_average", "")))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(SHAPES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache" / "infinity-server" / "bench-families")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    tokens = {"short": int(batch(16, 8, 24, False).attention_mask.sum()), "long": 512}
    stolen, total = steal()
    found: list[dict[str, Any]] = []
    for architecture in args.families.split(","):
        times = measure(architecture, args.work, args.rounds)
        load = round(os.getloadavg()[1], 2)  # the last five minutes: mostly the rounds just run
        for record in records(architecture, times, tokens):
            record["load_average"] = load
            print(json.dumps(record), flush=True)
            found.append(record)
    stolen_after, total_after = steal()
    share = (stolen_after - stolen) / max(1, total_after - total)
    print(f"\n{cpu()}, {args.rounds} rounds, hypervisor steal {share:.1%}\n")
    print(table(found))
    if args.json is not None:
        args.json.write_text(json.dumps({"cpu": cpu(), "rounds": args.rounds, "records": found}, indent=1))


if __name__ == "__main__":
    main()
