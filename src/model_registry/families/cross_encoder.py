"""Cross-encoder rerankers: a sequence-classification head with one label scores a pair."""

from __future__ import annotations

from model_registry.families.base import Facts, Family, Rule
from model_registry.types import Capability, Kind
from model_registry.zoo.files import label_count


def sequence_classification(facts: Facts) -> bool:
    return any(a.endswith("ForSequenceClassification") for a in facts.architectures)


FAMILY = Family(
    name="cross_encoder",
    kind=Kind.RERANKER,
    adapter="model_registry.adapters.sequence:RerankerAdapter",
    capabilities=frozenset({Capability.RERANK}),
    summary="cross-encoders: BGE, mxbai, ms-marco MiniLM, gte and ModernBERT rerankers",
    reference="sentence-transformers `CrossEncoder.predict`",
    default=True,
    engines=("torch", "onnx", "ctranslate2"),
    without_torch="model_registry.adapters.onnx_text:OnnxCrossEncoder",
    rules=(
        Rule(
            "cross-encoder",
            "kind",
            lambda f: sequence_classification(f) and label_count(f.config) == 1,
            "kind `reranker` (`*ForSequenceClassification` with one label)",
            order=40,
            kind=Kind.RERANKER,
        ),
    ),
)
