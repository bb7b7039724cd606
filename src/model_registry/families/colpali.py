"""Page retrieval: a vision-language model's vectors per image patch and per query token (MaxSim).

ColQwen2.5 is ColQwen2's layout on a Qwen2.5-VL backbone: the same architecture, `ColQwen2ForRetrieval`."""

from __future__ import annotations

from model_registry.families.base import Facts, Family, Rule
from model_registry.types import Capability, Kind


def _peft_only(facts: Facts) -> bool:
    """A PEFT adapter with no base model beside it (colpali-engine publishes ColQwen2.5 so)."""
    return facts.has("adapter_config.json") and not facts.has("config.json", inside=True)


def _peft_message(facts: Facts) -> str:
    return (
        f"{facts.root} holds a PEFT adapter (adapter_config.json) without its base model, as colpali-engine "
        "publishes ColQwen2 and ColQwen2.5 (colnomic-embed-multimodal too): these are not served from their "
        "adapter; serve the merged checkpoint in transformers' layout (ColQwen2ForRetrieval, the '-hf' "
        "repositories), which this server reads as it is. Only BiQwen2.5 adapters (nomic-embed-multimodal: "
        "processor_class BiQwen2_5_Processor, or `kind: dense` on an adapter of Qwen2.5-VL) are merged into "
        "their base model at load, which the entry's `base_model` names"
    )


FAMILY = Family(
    name="colpali",
    kind=Kind.PAGE_TEXT,
    adapter="model_registry.adapters.colpali:ColPaliAdapter",
    capabilities=frozenset({Capability.EMBED_TEXT, Capability.EMBED_IMAGE, Capability.MULTIVECTOR}),
    summary="page retrievers: ColPali, ColQwen2, ColQwen2.5, ColModernVBert (pages as images, PDFs rendered)",
    reference="transformers `ColPaliForRetrieval` / `ColQwen2ForRetrieval` / `ColModernVBertForRetrieval`",
    default=True,
    model_types=frozenset({"colpali", "colqwen2", "colmodernvbert"}),
    architectures=frozenset({"ColPaliForRetrieval", "ColQwen2ForRetrieval", "ColModernVBertForRetrieval"}),
    rules=(
        Rule(
            "peft-adapter-only",
            "layout",
            _peft_only,
            "refused: a PEFT adapter without its base model (colpali-engine's ColQwen layout); "
            "nomic-embed-multimodal's BiQwen2.5 adapter is claimed before, and served with `base_model`",
            order=70,
            refusal=_peft_message,
        ),
    ),
)
