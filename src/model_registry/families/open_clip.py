"""open_clip checkpoints: `open_clip_config.json` and its weights, no transformers config."""

from __future__ import annotations

from model_registry.families.base import Family, Rule
from model_registry.types import Capability, Kind

FAMILY = Family(
    name="open_clip",
    kind=Kind.IMAGE_TEXT,
    adapter="model_registry.adapters.open_clip:OpenClipAdapter",
    capabilities=frozenset({Capability.EMBED_TEXT, Capability.EMBED_IMAGE}),
    summary="open_clip checkpoints (LAION, DFN, MobileCLIP, SigLIP in open_clip's layout)",
    reference="open_clip `create_model_and_transforms`, `encode_text`, `encode_image`",
    layout="model_registry.detection.layout:open_clip_layout",
    rules=(
        Rule(
            "open-clip",
            "layout",
            lambda f: not f.has("config.json", inside=True) and f.has("open_clip_config.json"),
            "an open_clip checkpoint: kind `image_text`, served by `adapters/open_clip.py`",
            order=10,
            kind=Kind.IMAGE_TEXT,
            family="open_clip",
        ),
    ),
)
