"""SPLADE: a masked LM's logits, pooled into one weight per vocabulary token."""

from __future__ import annotations

from model_registry.families.base import Family, Rule
from model_registry.types import Capability, Kind

FAMILY = Family(
    name="splade",
    kind=Kind.SPARSE,
    adapter="model_registry.adapters.splade:SpladeAdapter",
    capabilities=frozenset({Capability.SPARSE}),
    summary="SPLADE sparse encoders (sentence-transformers' SparseEncoder: MLMTransformer + SpladePooling)",
    reference="sentence-transformers `SparseEncoder.encode`",
    default=True,
    engines=("torch", "onnx"),
    rules=(
        Rule(
            "splade",
            "kind",
            lambda f: "SpladePooling" in f.modules or "MLMTransformer" in f.modules,
            "kind `sparse` (sentence-transformers' SparseEncoder modules)",
            order=30,
            kind=Kind.SPARSE,
        ),
    ),
)
