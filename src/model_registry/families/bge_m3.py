"""BGE-M3: one forward pass, three outputs (dense, sparse lexical weights, ColBERT vectors)."""

from __future__ import annotations

from model_registry.families.base import Family, Rule
from model_registry.types import Capability, Kind

FAMILY = Family(
    name="bge_m3",
    kind=Kind.MULTI_OUTPUT,
    adapter="model_registry.adapters.bge_m3:BgeM3Adapter",
    capabilities=frozenset({Capability.EMBED_TEXT, Capability.SPARSE, Capability.MULTIVECTOR}),
    summary="BGE-M3 with FlagEmbedding's `colbert_linear.pt` and `sparse_linear.pt`",
    reference="FlagEmbedding `BGEM3FlagModel.encode`",
    default=True,
    engines=("torch", "onnx"),
    rules=(
        Rule(
            "bge-m3",
            "kind",
            lambda f: f.has("colbert_linear.pt") and f.has("sparse_linear.pt"),
            "kind `multi_output` (FlagEmbedding's `colbert_linear.pt` and `sparse_linear.pt`)",
            order=10,
            kind=Kind.MULTI_OUTPUT,
        ),
    ),
)
