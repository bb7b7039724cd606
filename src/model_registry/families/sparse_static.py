"""Inference-free sparse: the query side of an inference-free SPLADE, a weight per token from a table."""

from __future__ import annotations

from model_registry.families.base import Facts, Family, Rule
from model_registry.types import Capability, Kind


def _sparse_static(facts: Facts) -> bool:
    """modules.json (or a Router's route) names sentence-transformers' SparseStaticEmbedding."""
    return any(
        t.startswith("sentence_transformers.") and t.endswith(".SparseStaticEmbedding") for t in facts.module_types
    )


def _kind_message(facts: Facts) -> str:
    return (
        f"{facts.root} holds a SparseStaticEmbedding module (a weight per token, such as an IDF table): it is served "
        f"as kind sparse only, not {facts.kind_name()}"
    )


FAMILY = Family(
    name="sparse_static",
    kind=Kind.SPARSE,
    adapter="model_registry.adapters.sparse_static:SparseStaticAdapter",
    capabilities=frozenset({Capability.SPARSE}),
    summary="inference-free sparse queries: sentence-transformers' SparseStaticEmbedding, on numpy",
    reference="sentence-transformers `SparseEncoder.encode_query`",
    engineless=True,
    engines=(),
    layout="model_registry.detection.layout:sparse_static_layout",
    rules=(
        Rule(
            "sparse-static-not-sparse",
            "layout",
            lambda f: _sparse_static(f) and f.kind not in (None, Kind.SPARSE),
            "refused: a SparseStaticEmbedding module with a kind other than `sparse`",
            order=30,
            refusal=_kind_message,
        ),
        Rule(
            "sparse-static",
            "layout",
            _sparse_static,
            "sentence-transformers' SparseStaticEmbedding module (the query side of an inference-free sparse "
            "model): kind `sparse`, each token's weight from its table on numpy, no engine "
            "(`adapters/sparse_static.py`)",
            order=31,
            kind=Kind.SPARSE,
            family="sparse_static",
        ),
    ),
)
