"""Image-text towers in transformers' layout: CLIP and SigLIP."""

from __future__ import annotations

from model_registry.families.base import Family
from model_registry.types import Capability, Kind

FAMILY = Family(
    name="clip",
    kind=Kind.IMAGE_TEXT,
    adapter="model_registry.adapters.clip:ClipAdapter",
    capabilities=frozenset({Capability.EMBED_TEXT, Capability.EMBED_IMAGE}),
    summary="CLIP and SigLIP image-text towers (transformers' layout)",
    reference="transformers `CLIPModel` / `SiglipModel` `get_text_features`, `get_image_features`",
    default=True,
    model_types=frozenset({"clip", "siglip"}),
    architectures=frozenset({"CLIPModel", "SiglipModel"}),
)
