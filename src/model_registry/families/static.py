"""Static embeddings: a table of token vectors, averaged (model2vec, sentence-transformers' StaticEmbedding)."""

from __future__ import annotations

from model_registry.families.base import Facts, Family, Rule
from model_registry.types import Capability, Kind


def _sentence_transformers_static(facts: Facts) -> bool:
    """modules.json names sentence-transformers' StaticEmbedding (under any of its releases' paths)."""
    return any(t.startswith("sentence_transformers.") and t.endswith(".StaticEmbedding") for t in facts.module_types)


def is_static(facts: Facts) -> bool:
    return facts.model_type == "model2vec" or _sentence_transformers_static(facts)


def _kind_message(facts: Facts) -> str:
    return (
        f"{facts.root} holds a static embedding model (a table of token vectors, averaged): it is served as kind "
        f"dense only, not {facts.kind_name()}"
    )


FAMILY = Family(
    name="static",
    kind=Kind.DENSE,
    adapter="model_registry.adapters.static:StaticAdapter",
    capabilities=frozenset({Capability.EMBED_TEXT}),
    summary="static embeddings: model2vec and sentence-transformers' StaticEmbedding, on numpy",
    reference="model2vec `StaticModel.encode`; sentence-transformers `SentenceTransformer.encode`",
    engineless=True,
    engines=(),
    layout="model_registry.detection.layout:static_layout",
    rules=(
        Rule(
            "static-not-dense",
            "layout",
            lambda f: is_static(f) and f.kind not in (None, Kind.DENSE),
            "refused: a static embedding model with a kind other than `dense`",
            order=20,
            refusal=_kind_message,
        ),
        Rule(
            "model2vec",
            "layout",
            lambda f: f.model_type == "model2vec",
            "a model2vec static model (config.json's `model_type: model2vec`): kind `dense`, computed as "
            "model2vec's `StaticModel.encode` on numpy, no engine (`adapters/static.py`)",
            order=21,
            kind=Kind.DENSE,
            family="static",
        ),
        Rule(
            "static-embedding",
            "layout",
            _sentence_transformers_static,
            "sentence-transformers' StaticEmbedding module: kind `dense`, computed as `SentenceTransformer.encode` "
            "on numpy, no engine (`adapters/static.py`)",
            order=22,
            kind=Kind.DENSE,
            family="static",
        ),
    ),
)
