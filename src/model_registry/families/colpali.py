"""Page retrieval: a vision-language model's vectors per image patch and per query token (MaxSim)."""

from __future__ import annotations

from model_registry.families.base import Family
from model_registry.types import Capability, Kind

FAMILY = Family(
    name="colpali",
    kind=Kind.PAGE_TEXT,
    adapter="model_registry.adapters.colpali:ColPaliAdapter",
    capabilities=frozenset({Capability.EMBED_TEXT, Capability.EMBED_IMAGE, Capability.MULTIVECTOR}),
    summary="page retrievers: ColPali, ColQwen2, ColModernVBert (pages as images, PDFs rendered)",
    reference="transformers `ColPaliForRetrieval` / `ColQwen2ForRetrieval` / `ColModernVBertForRetrieval`",
    default=True,
    model_types=frozenset({"colpali", "colqwen2", "colmodernvbert"}),
    architectures=frozenset({"ColPaliForRetrieval", "ColQwen2ForRetrieval", "ColModernVBertForRetrieval"}),
)
