"""Audio-text towers: CLAP."""

from __future__ import annotations

from model_registry.families.base import Family
from model_registry.types import Capability, Kind

FAMILY = Family(
    name="clap",
    kind=Kind.AUDIO_TEXT,
    adapter="model_registry.adapters.clap:ClapAdapter",
    capabilities=frozenset({Capability.EMBED_TEXT, Capability.EMBED_AUDIO}),
    summary="CLAP audio-text towers",
    reference="transformers `ClapModel` `get_text_features`, `get_audio_features`",
    default=True,
    model_types=frozenset({"clap"}),
    architectures=frozenset({"ClapModel"}),
)
