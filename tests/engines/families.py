"""The text families the converting engines serve, each with a tiny model builder, the kind it is
configured as, the items it is run on and the engines beside torch that serve it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from model_registry.types import Item, Output
from tests.builders.text import tiny_bert
from tests.builders.zoo import tiny_bge_m3, tiny_colbert, tiny_cross_encoder, tiny_masked_lm, tiny_xlmr_cross_encoder
from tests.engines.helpers import classify_items, embed_items, pair_items

ALL = frozenset(Output)


def _colbert_items() -> list[Item]:
    return embed_items(frozenset({Output.MULTIVECTOR})) + embed_items(frozenset({Output.MULTIVECTOR}), query=True)


#: family -> (builder, kind, items, engines beside torch)
FAMILIES: dict[str, tuple[Callable[[Path], Path], str, Callable[[], list[Item]], tuple[str, ...]]] = {
    "dense": (tiny_bert, "auto", embed_items, ("onnx", "ctranslate2")),
    "reranker": (tiny_cross_encoder, "reranker", pair_items, ("onnx", "ctranslate2")),
    "xlmr-reranker": (tiny_xlmr_cross_encoder, "reranker", pair_items, ("onnx", "ctranslate2")),
    "classifier": (
        lambda root: tiny_cross_encoder(root, labels=3),
        "classifier",
        classify_items,
        ("onnx", "ctranslate2"),
    ),
    "splade": (tiny_masked_lm, "sparse", lambda: embed_items(frozenset({Output.SPARSE})), ("onnx",)),
    "colbert": (tiny_colbert, "auto", _colbert_items, ("onnx",)),
    "bge-m3": (tiny_bge_m3, "auto", lambda: embed_items(ALL), ("onnx",)),
}
