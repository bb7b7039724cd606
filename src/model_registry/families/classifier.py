"""Text classifiers: a sequence-classification head with several labels."""

from __future__ import annotations

from model_registry.families.base import Family, Rule
from model_registry.families.cross_encoder import sequence_classification
from model_registry.types import Capability, Kind

FAMILY = Family(
    name="classifier",
    kind=Kind.CLASSIFIER,
    adapter="model_registry.adapters.sequence:ClassifierAdapter",
    capabilities=frozenset({Capability.CLASSIFY}),
    summary="sequence classifiers (sentiment, NLI, topic) with their labels",
    reference="transformers' text-classification pipeline",
    default=True,
    engines=("torch", "onnx", "ctranslate2"),
    rules=(
        Rule(
            "classifier",
            "kind",
            sequence_classification,
            "kind `classifier` (`*ForSequenceClassification` with several labels)",
            order=41,  # after the one-label cross-encoder
            kind=Kind.CLASSIFIER,
        ),
    ),
)
