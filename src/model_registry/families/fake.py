"""A stand-in model for tests and benchmarks of the server itself: vectors from a hash of the text."""

from __future__ import annotations

from model_registry.families.base import Family
from model_registry.types import Capability, Kind

FAMILY = Family(
    name="fake",
    kind=Kind.FAKE,
    adapter="model_registry.adapters.fake:FakeAdapter",
    capabilities=frozenset({Capability.EMBED_TEXT}),
    summary="`kind: fake`: deterministic vectors from a hash, for testing the server (no model files)",
    reference="its own definition",
    default=True,
    engineless=True,
    engines=(),
)
