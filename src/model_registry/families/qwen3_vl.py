"""Qwen3-VL-Embedding: one Qwen3-VL model embeds texts and images into one space.

As published, `config.json` says `Qwen3VLForConditionalGeneration` (model_type `qwen3_vl`, with a
`vision_config`) and sentence-transformers modules last-token pool the language model's hidden
states and normalise them. The same config without those modules is Qwen3-VL-Reranker or the
chat model, neither served here: they are refused unless the entry says `kind: dense` (an
embedding checkpoint published before its sentence-transformers files)."""

from __future__ import annotations

from model_registry.families.base import Facts, Family, Rule
from model_registry.types import Capability, Kind

MODEL_TYPE = "qwen3_vl"


def _qwen3_vl(facts: Facts) -> bool:
    return facts.model_type == MODEL_TYPE


def _not_an_embedder(facts: Facts) -> bool:
    """Qwen3-VL files that do not say they embed: no Pooling module and no `kind: dense`, or
    another kind set in the entry."""
    if not _qwen3_vl(facts):
        return False
    if facts.kind is not None:
        return facts.kind != Kind.DENSE
    return "Pooling" not in facts.modules


def _message(facts: Facts) -> str:
    what = ", ".join(facts.architectures) or facts.model_type
    asked = f" as kind '{facts.kind.value}'" if facts.kind is not None else ""
    return (
        f"{facts.root} holds a vision-language model ({what}, model_type {facts.model_type}) that this server "
        f"does not serve{asked}: Qwen3-VL is served as Qwen3-VL-Embedding only, from its sentence-transformers "
        "modules (Transformer, Pooling with lasttoken, Normalize) or with `kind: dense`. Qwen3-VL-Reranker and "
        "the chat models are not served; their reference code (the Qwen3-VL-Embedding repository's) or vLLM's "
        "pooling runner serves them"
    )


FAMILY = Family(
    name="qwen3_vl",
    kind=Kind.DENSE,
    adapter="model_registry.adapters.qwen3_vl:Qwen3VLEmbeddingAdapter",
    capabilities=frozenset({Capability.EMBED_TEXT, Capability.EMBED_IMAGE}),
    summary="Qwen3-VL-Embedding: texts and images (min/max pixels) in one space, its instruction as system prompt",
    reference="the Qwen3-VL-Embedding repository's `Qwen3VLEmbedder` (transformers `Qwen3VLModel`, last token)",
    model_types=frozenset({MODEL_TYPE}),
    rules=(
        Rule(
            "qwen3-vl-not-embedding",
            "layout",
            _not_an_embedder,
            "refused: a Qwen3-VL model without sentence-transformers pooling or `kind: dense` (the reranker, "
            "the chat models)",
            order=89,
            refusal=_message,
        ),
        Rule(
            "qwen3-vl-embedding",
            "family",
            _qwen3_vl,
            "Qwen3-VL-Embedding, served by `adapters/qwen3_vl.py`",
            order=30,
            family="qwen3_vl",
        ),
    ),
)
