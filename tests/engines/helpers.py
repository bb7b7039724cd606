"""Running one adapter on a chosen engine, in-process, for parity tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from model_registry.adapters import Adapter, LoadOptions, create_adapter
from model_registry.config import ModelSpec
from model_registry.types import ClassifyItem, EmbedItem, Item, Output, PairItem, Result, Text

TEXTS = [
    "The cat sleeps on the warm windowsill.",
    "Two dogs are running through the snow, barking at every passing car!",
    "What is the capital of France? Paris, of course.",
    "hello",
]


def load(
    directory: Path,
    backend: str,
    cache: Path,
    *,
    kind: str = "auto",
    quantize: str = "none",
    device: str = "cpu",
    dtype: str = "auto",
    cuda_graphs: bool | Literal["auto"] = False,
) -> Adapter:
    """`directory` loaded on one engine; CUDA graphs off unless asked, so that a test of the eager
    path on a GPU runs it for small batches too."""
    spec = ModelSpec.model_validate(
        {"name": "m", "source": str(directory), "kind": kind, "backend": backend, "quantize": quantize}
    )
    adapter = create_adapter(spec)
    options = LoadOptions(
        device=device,
        dtype=dtype,
        max_batch_tokens=4096,
        backend=backend,
        quantize=quantize,
        cache_dir=str(cache),
        cuda_graphs=cuda_graphs,
    )
    adapter.load(options)
    return adapter


def run(adapter: Adapter, items: Sequence[Item]) -> list[Result]:
    prepared = adapter.prepare(items)
    batch = adapter.collate(prepared)
    return adapter.postprocess(batch, adapter.forward(batch))


def embed_items(outputs: frozenset[Output] = frozenset({Output.DENSE}), query: bool = False) -> list[Item]:
    return [EmbedItem(Text(t), outputs=outputs, is_query=query) for t in TEXTS]


def pair_items() -> list[Item]:
    return [PairItem(TEXTS[0], t) for t in TEXTS]


def classify_items() -> list[Item]:
    """The texts, then pairs of them (an NLI model's premise and hypothesis), in one batch."""
    texts: list[Item] = [ClassifyItem(t) for t in TEXTS]
    return texts + [ClassifyItem(TEXTS[1], pair=t) for t in TEXTS]


def arrays(result: Result) -> list[np.ndarray]:
    """Every number a result carries, as arrays, in a fixed order (sparse as index and value)."""
    found: list[np.ndarray] = []
    for name in ("dense", "multivector", "logits"):
        value: Any = getattr(result, name, None)
        if value is not None:
            found.append(np.asarray(value, dtype=np.float64))
    sparse = getattr(result, "sparse", None)
    if sparse is not None:
        found += [np.asarray(sparse.indices, dtype=np.float64), np.asarray(sparse.values, dtype=np.float64)]
    for name in ("value", "logit"):
        value = getattr(result, name, None)
        if value is not None:
            found.append(np.asarray([value], dtype=np.float64))
    return found


def max_difference(left: Sequence[Result], right: Sequence[Result]) -> float:
    """The largest absolute difference between two result lists (inf when their shapes differ)."""
    worst = 0.0
    assert len(left) == len(right)
    for a, b in zip(left, right, strict=True):
        xs, ys = arrays(a), arrays(b)
        assert xs, f"{a} carries no output"
        assert len(xs) == len(ys), f"{a} and {b} carry different outputs"
        for x, y in zip(xs, ys, strict=True):
            if x.shape != y.shape:
                return float("inf")
            worst = max(worst, float(np.abs(x - y).max(initial=0.0)))
    return worst
