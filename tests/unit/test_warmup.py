"""Worst-case warm-up batches for every model kind, run through each tiny model's own stages."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from model_registry.adapters import LoadOptions, create_adapter
from model_registry.backends.weights import weight_bytes
from model_registry.config import ModelSpec
from model_registry.runtime.memory import load_and_measure
from model_registry.runtime.warmup import run_batches, worst_case_batches
from model_registry.types import ClassifyItem, EmbedItem, Media, Output, PairItem
from tests.builders import media, zoo

BUDGET = 256

# Per kind, fixed in advance: (what each warm-up batch holds, the outputs asked of its texts).
KINDS: dict[str, tuple[Callable[[Path], Path], list[str], frozenset[Output]]] = {
    "reranker": (zoo.tiny_cross_encoder, ["pair"], frozenset()),
    "classifier": (lambda root: zoo.tiny_cross_encoder(root, labels=3), ["classify"], frozenset()),
    "colbert": (zoo.tiny_colbert, ["text"], frozenset({Output.MULTIVECTOR})),
    "bge-m3": (zoo.tiny_bge_m3, ["text"], frozenset({Output.DENSE, Output.SPARSE, Output.MULTIVECTOR})),
    "clip": (media.tiny_clip, ["text", "image"], frozenset({Output.DENSE})),
    "clap": (media.tiny_clap, ["text", "audio"], frozenset({Output.DENSE})),
    "colpali": (media.tiny_colpali, ["text", "image"], frozenset({Output.MULTIVECTOR})),
}


def shape(items: list[object]) -> str:
    first = items[0]
    if isinstance(first, PairItem):
        return "pair"
    if isinstance(first, ClassifyItem):
        return "classify"
    assert isinstance(first, EmbedItem)
    content = first.content
    return content.modality.value if isinstance(content, Media) else "text"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_warms_up_on_a_full_batch_of_each_input_it_takes(kind: str, tmp_path: Path) -> None:
    build, expected, outputs = KINDS[kind]
    adapter = create_adapter(ModelSpec(name=kind, source=str(build(tmp_path / kind))))
    adapter.load(LoadOptions(device="cpu", dtype="float32", max_batch_tokens=BUDGET))
    try:
        batches = worst_case_batches(adapter, BUDGET)
        assert [shape(list(b)) for b in batches] == expected
        for batch in batches:
            first = batch[0]
            assert all(item is first for item in batch)
            if isinstance(first, EmbedItem) and not isinstance(first.content, Media):
                assert first.outputs == outputs
            costs = [adapter.prepare(batch[:1])[0].cost] * len(batch)  # copies of one input
            # Full: one more item would not fit the budget (or one item alone is over it).
            assert sum(costs) <= BUDGET or len(costs) == 1
            assert sum(costs) + max(costs) > BUDGET
        assert run_batches(adapter, batches) == len(batches)
    finally:
        adapter.unload()


@pytest.mark.gpu
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_cuda_footprint_of_every_kind_covers_its_weights_and_its_worst_batch(kind: str, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    build, _, _ = KINDS[kind]
    root = build(tmp_path / kind)
    adapter = create_adapter(ModelSpec(name=kind, source=str(root)))
    options = LoadOptions(device="cuda", dtype="float32", max_batch_tokens=BUDGET)
    # Not zero after an earlier test: torch keeps a cuBLAS workspace per thread for the process.
    before = torch.cuda.memory_allocated()
    measured = load_and_measure(adapter, options, "cuda:0")
    try:
        held = torch.cuda.memory_allocated() - before
        assert measured > weight_bytes(root)
        assert measured >= held  # the peak of the warm-up is above what the loaded model holds
    finally:
        adapter.unload()
