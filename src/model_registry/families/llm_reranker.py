"""LLM rerankers: a causal LM asked whether a document answers a query, scored by its yes/no logits."""

from __future__ import annotations

from model_registry.families.base import Facts, Family, Rule
from model_registry.families.qwen3_vl import is_reranker as is_qwen3_vl_reranker
from model_registry.types import Capability, Kind
from model_registry.zoo.files import is_causal_lm, reranker_chat_template


def _llm_reranker(facts: Facts) -> bool:
    return facts.kind == Kind.RERANKER and is_causal_lm(facts.architectures)


def _rerank_keys_message(facts: Facts) -> str:
    return (
        f"{', '.join(sorted(facts.rerank_keys))} apply to LLM rerankers (a causal LM with kind: reranker); this "
        f"model is a {facts.kind_name()} model ({', '.join(facts.architectures) or facts.model_type})"
    )


FAMILY = Family(
    name="llm_reranker",
    kind=Kind.RERANKER,
    adapter="model_registry.adapters.llm_reranker:LlmRerankerAdapter",
    capabilities=frozenset({Capability.RERANK}),
    summary="LLM rerankers: Qwen3-Reranker, bge-reranker-v2-gemma, mxbai-rerank-v2 (yes/no logits)",
    reference="each model card's scoring code (its prompt, tokenized as the card does)",
    rules=(
        Rule(
            "llm-reranker-template",
            "kind",
            lambda f: is_causal_lm(f.architectures) and reranker_chat_template(f.root),
            "kind `reranker` (a causal LM whose chat template renders the `query` and `document` roles)",
            order=50,
            kind=Kind.RERANKER,
        ),
        Rule(
            "rerank-keys-elsewhere",
            "family",
            lambda f: bool(f.rerank_keys) and not _llm_reranker(f) and not is_qwen3_vl_reranker(f),
            "refused: `template`, `true_token`, `false_token` or `instruction` on a model that is not an LLM reranker "
            "(Qwen3-VL-Reranker takes `instruction`)",
            order=10,
            refusal=_rerank_keys_message,
        ),
        Rule(
            "llm-reranker",
            "family",
            _llm_reranker,
            "a causal LM with kind `reranker`: scored by its yes/no logits (`adapters/llm_reranker.py`)",
            order=40,
            family="llm_reranker",
        ),
    ),
)
