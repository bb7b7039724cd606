"""Qwen3-VL-Embedding: one Qwen3-VL model embeds texts and images into one space.

As published, `config.json` says `Qwen3VLForConditionalGeneration` (model_type `qwen3_vl`, with a
`vision_config`) and sentence-transformers modules last-token pool the language model's hidden
states and normalise them. The same config without those modules is Qwen3-VL-Reranker or the
chat model, which nothing in the files tells apart: such files are refused unless the entry says
`kind: reranker` (Qwen3-VL-Reranker, `families/qwen3_vl_reranker.py`) or `kind: dense` (an
embedding checkpoint published before its sentence-transformers files)."""

from __future__ import annotations

from model_registry.families.base import Facts, Family, Rule
from model_registry.types import Capability, Kind

MODEL_TYPE = "qwen3_vl"


def _qwen3_vl(facts: Facts) -> bool:
    return facts.model_type == MODEL_TYPE


def is_reranker(facts: Facts) -> bool:
    """Qwen3-VL files without sentence-transformers modules that the entry calls a reranker."""
    return _qwen3_vl(facts) and facts.kind == Kind.RERANKER and not facts.module_types


def _not_served(facts: Facts) -> bool:
    """Qwen3-VL files that neither say they embed (a Pooling module, or `kind: dense`) nor are
    called a reranker (`kind: reranker` on files without sentence-transformers modules)."""
    if not _qwen3_vl(facts) or is_reranker(facts):
        return False
    if facts.kind is not None:
        return facts.kind != Kind.DENSE
    return "Pooling" not in facts.modules


def _message(facts: Facts) -> str:
    what = ", ".join(facts.architectures) or facts.model_type
    asked = f" as kind '{facts.kind.value}'" if facts.kind is not None else ""
    if facts.kind is None:
        why = (
            "its files do not say whether it embeds, reranks or chats. Set `kind: reranker` for Qwen3-VL-Reranker "
            "(its files are a Qwen3-VL chat model's; nothing in them tells the two apart), or `kind: dense` for "
            "Qwen3-VL-Embedding files without their sentence-transformers modules"
        )
    else:
        why = (
            "Qwen3-VL is served as Qwen3-VL-Embedding (its sentence-transformers modules, or `kind: dense`) and as "
            "Qwen3-VL-Reranker (`kind: reranker` on files without sentence-transformers modules)"
        )
    return (
        f"{facts.root} holds a vision-language model ({what}, model_type {facts.model_type}) that this server "
        f"does not serve{asked}: {why}. Qwen3-VL's chat models are not served"
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
            _not_served,
            "refused: a Qwen3-VL model without sentence-transformers pooling, `kind: dense` or `kind: reranker` "
            "(nothing in the files tells the reranker from the chat models)",
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
