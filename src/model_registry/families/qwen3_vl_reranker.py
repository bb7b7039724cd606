"""Qwen3-VL-Reranker: a Qwen3-VL model that judges whether a document (text or image) meets a
query, scored by its 'yes' and 'no' logits.

As published, its files are a Qwen3-VL chat model's (`Qwen3VLForConditionalGeneration`,
model_type `qwen3_vl`, no sentence-transformers modules): nothing in them says it reranks, so the
entry says `kind: reranker` (without it the files are refused, `families/qwen3_vl.py`). The
entry's `instruction` replaces the default instruction; the other LLM reranker keys (`template`,
`true_token`, `false_token`) are refused, its prompt and tokens being fixed."""

from __future__ import annotations

from model_registry.families.base import Facts, Family, Rule
from model_registry.families.qwen3_vl import is_reranker
from model_registry.types import Capability, Kind

#: The LLM reranker keys an entry may set on this family.
ENTRY_KEYS = frozenset({"instruction"})


def _fixed_keys(facts: Facts) -> list[str]:
    return sorted(set(facts.rerank_keys) - ENTRY_KEYS)


def _fixed_keys_message(facts: Facts) -> str:
    return (
        f"{', '.join(_fixed_keys(facts))} cannot be set on Qwen3-VL-Reranker: its prompt and its scoring tokens "
        "('yes' against 'no') are its reference code's; only `instruction` (the default instruction) may be set"
    )


FAMILY = Family(
    name="qwen3_vl_reranker",
    kind=Kind.RERANKER,
    adapter="model_registry.adapters.qwen3_vl_reranker:Qwen3VLRerankerAdapter",
    capabilities=frozenset({Capability.RERANK}),
    summary="Qwen3-VL-Reranker (`kind: reranker`): text or image documents, p(yes) against no at the last token",
    reference="the Qwen3-VL-Embedding repository's `Qwen3VLReranker` (transformers `Qwen3VLForConditionalGeneration`)",
    rules=(
        Rule(
            "qwen3-vl-reranker-keys",
            "family",
            lambda f: is_reranker(f) and bool(_fixed_keys(f)),
            "refused: `template`, `true_token` or `false_token` on Qwen3-VL-Reranker (its prompt is fixed)",
            order=9,
            refusal=_fixed_keys_message,
        ),
        Rule(
            "qwen3-vl-reranker",
            "family",
            is_reranker,
            "Qwen3-VL with `kind: reranker` and no sentence-transformers modules: Qwen3-VL-Reranker, served by "
            "`adapters/qwen3_vl_reranker.py`",
            order=29,
            family="qwen3_vl_reranker",
        ),
    ),
)
