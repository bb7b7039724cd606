"""SigLIP 2 NaFlex: images as patches at their own aspect ratio, up to a patch budget."""

from __future__ import annotations

from model_registry.families.base import Family, Rule
from model_registry.types import Capability, Kind

FAMILY = Family(
    name="naflex",
    kind=Kind.IMAGE_TEXT,
    adapter="model_registry.adapters.naflex:NaflexAdapter",
    capabilities=frozenset({Capability.EMBED_TEXT, Capability.EMBED_IMAGE}),
    summary="SigLIP 2 (NaFlex): variable resolution image-text towers",
    reference="transformers `Siglip2Model` with its processor",
    model_types=frozenset({"siglip2"}),
    architectures=frozenset({"Siglip2Model"}),
    rules=(
        Rule(
            "siglip2-naflex",
            "family",
            lambda f: f.model_type == "siglip2",
            "SigLIP 2 NaFlex, served by `adapters/naflex.py`",
            order=30,
            family="naflex",
        ),
    ),
)
