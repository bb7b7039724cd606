"""ColBERT late interaction: one vector per token, scored by MaxSim (PyLate's and colbert-ai's layouts)."""

from __future__ import annotations

from model_registry.families.base import Family, Rule
from model_registry.types import Capability, Kind
from model_registry.zoo.files import is_pylate

FAMILY = Family(
    name="colbert",
    kind=Kind.MULTIVECTOR,
    adapter="model_registry.adapters.colbert:ColbertAdapter",
    capabilities=frozenset({Capability.MULTIVECTOR}),
    summary="ColBERT: PyLate checkpoints (GTE-ModernColBERT, answerai-colbert) and colbert-ai's layout",
    reference="PyLate `ColBERT.encode` and its MaxSim",
    default=True,
    engines=("torch", "onnx"),
    rules=(
        Rule(
            "colbert-ai",
            "kind",
            lambda f: f.has("artifact.metadata"),
            "kind `multivector` (colbert-ai's `artifact.metadata`)",
            order=20,
            kind=Kind.MULTIVECTOR,
        ),
        Rule(
            "pylate",
            "kind",
            lambda f: is_pylate(f.root, f.modules),
            "kind `multivector` (Transformer + Dense, no Pooling, ColBERT lengths or prefixes)",
            order=21,
            kind=Kind.MULTIVECTOR,
        ),
    ),
)
