"""The text families the converting engines serve, each with a tiny model builder, the kind it is
configured as, the items it is run on and the engines beside torch that serve it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from model_registry.types import EmbedItem, Item, Output, Text
from tests.builders.catalogue import (
    GEMMA_PROMPTS,
    NOMIC_PROMPTS,
    tiny_gte_modernbert,
    tiny_modernbert_embedder,
    tiny_nomic,
)
from tests.builders.jina import tiny_jina_v3_hf
from tests.builders.text import tiny_bert
from tests.builders.wide import wide_embeddinggemma, wide_qwen3_embedding
from tests.builders.zoo import (
    tiny_bge_m3,
    tiny_colbert,
    tiny_cross_encoder,
    tiny_masked_lm,
    tiny_modern_colbert,
    tiny_modernbert_cross_encoder,
    tiny_xlmr_cross_encoder,
)
from tests.engines.helpers import TEXTS, classify_items, embed_items, pair_items

ALL = frozenset(Output)


def _colbert_items() -> list[Item]:
    return embed_items(frozenset({Output.MULTIVECTOR})) + embed_items(frozenset({Output.MULTIVECTOR}), query=True)


def _prompted(prompts: dict[str, str]) -> Callable[[], list[Item]]:
    """The texts as they are and behind the model's query prompt."""
    return lambda: embed_items() + [EmbedItem(Text(t), prompt=prompts["query"]) for t in TEXTS]


#: family -> (builder, kind, items, engines beside torch)
FAMILIES: dict[str, tuple[Callable[[Path], Path], str, Callable[[], list[Item]], tuple[str, ...]]] = {
    "dense": (tiny_bert, "auto", embed_items, ("onnx", "ctranslate2")),
    "reranker": (tiny_cross_encoder, "reranker", pair_items, ("onnx", "ctranslate2")),
    "xlmr-reranker": (tiny_xlmr_cross_encoder, "reranker", pair_items, ("onnx", "ctranslate2")),
    "classifier": (
        lambda root: tiny_cross_encoder(root, labels=3, initializer_range=0.3, segment_ids=True),
        "classifier",
        classify_items,
        ("onnx", "ctranslate2"),
    ),
    "splade": (tiny_masked_lm, "sparse", lambda: embed_items(frozenset({Output.SPARSE})), ("onnx",)),
    "colbert": (tiny_colbert, "auto", _colbert_items, ("onnx",)),
    "bge-m3": (tiny_bge_m3, "auto", lambda: embed_items(ALL), ("onnx",)),
}

#: The architectures beyond the BERT family that ONNX Runtime serves (ModernBERT, nomic_bert, Qwen3,
#: Gemma 3, jina-embeddings-v3's port), each family in its published layout:
#: family -> (builder, kind, items, architecture).
#: CTranslate2 converts none of them.
MODERN: dict[str, tuple[Callable[[Path], Path], str, Callable[[], list[Item]], str]] = {
    "gte-modernbert": (tiny_gte_modernbert, "auto", embed_items, "modernbert"),
    "modernbert-embed": (tiny_modernbert_embedder, "auto", _prompted(NOMIC_PROMPTS), "modernbert"),
    "modernbert-reranker": (tiny_modernbert_cross_encoder, "reranker", pair_items, "modernbert"),
    "modern-colbert": (tiny_modern_colbert, "auto", _colbert_items, "modernbert"),
    "nomic": (tiny_nomic, "auto", _prompted(NOMIC_PROMPTS), "nomic_bert"),
    "qwen3-embedding": (wide_qwen3_embedding, "auto", embed_items, "qwen3"),
    "embeddinggemma": (wide_embeddinggemma, "auto", _prompted(GEMMA_PROMPTS), "gemma3_text"),
    "jina-v3-hf": (tiny_jina_v3_hf, "auto", embed_items, "jina_embeddings_v3"),
}
