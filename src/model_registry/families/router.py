"""sentence-transformers' Router: a module chain per route (query, document), one adapter each.

No rule detects it: `detect` reads the Router from modules.json before the rules run, and each
route's chain is detected as a model of its own."""

from __future__ import annotations

from model_registry.families.base import Family

FAMILY = Family(
    name="router",
    kind=None,
    adapter="model_registry.adapters.router:RouterAdapter",
    capabilities=frozenset(),
    summary="sentence-transformers' Router (and Asym): a module chain per side, dense or sparse",
    reference="sentence-transformers `encode_query`, `encode_document`",
    engines=("torch", "onnx", "ctranslate2"),
)
