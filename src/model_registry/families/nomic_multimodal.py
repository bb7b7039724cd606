"""nomic-embed-multimodal (nomic-ai/nomic-embed-multimodal-3b, -7b): colpali-engine's BiQwen2.5, one
Qwen2.5-VL model embedding texts and page images into one vector.

As published, the directory is a PEFT LoRA adapter alone (adapter_config.json naming its base,
`Qwen/Qwen2.5-VL-3B-Instruct` or `-7B-Instruct`, and adapter_model.safetensors) with the
processor's files, which name colpali-engine's `BiQwen2_5_Processor`; there is no config.json.
The entry's `base_model` names the base (else the adapter's `base_model_name_or_path` is looked
up as a `source` is: a directory, or the local hub cache), and the adapter is merged into it at
load (`detection/peft_base.py` lays the two out, `adapters/nomic_multimodal.py` serves them). An
adapter of a Qwen2.5-VL base whose processor files do not say BiQwen2.5 is served so when the
entry says `kind: dense`. colpali-engine's ColQwen2.5 adapters (colnomic-embed-multimodal) stay
refused (`families/colpali.py`)."""

from __future__ import annotations

import json
from typing import Any

from model_registry.families.base import Facts, Family, Rule
from model_registry.types import Capability, Kind

PROCESSOR_CLASS = "BiQwen2_5_Processor"
#: Where a processor saved by transformers names its class: the image processor's file (4.x),
#: the processor's (5.x) and the tokenizer's.
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "tokenizer_config.json")


def _json(facts: Facts, name: str) -> dict[str, Any]:
    try:
        data = json.loads((facts.root / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # absent or unreadable: the layout reports what it needs
        return {}
    return data if isinstance(data, dict) else {}


def adapter_only(facts: Facts) -> bool:
    """A PEFT adapter directory without the model it adapts."""
    return facts.has("adapter_config.json") and not facts.has("config.json", inside=True)


def processor_classes(facts: Facts) -> set[str]:
    return {str(_json(facts, name).get("processor_class", "")) for name in PROCESSOR_FILES} - {""}


def qwen2_5_vl_base(facts: Facts) -> bool:
    """The adapter's base, as adapter_config.json names it, is a Qwen2.5-VL model."""
    base = str(_json(facts, "adapter_config.json").get("base_model_name_or_path") or "").lower()
    return any(mark in base for mark in ("qwen2.5-vl", "qwen2_5_vl", "qwen2_5-vl"))


def is_nomic_multimodal(facts: Facts) -> bool:
    """A PEFT adapter alone whose processor files say BiQwen2.5, or which the entry calls `kind:
    dense` and whose base is Qwen2.5-VL."""
    if not adapter_only(facts):
        return False
    classes = processor_classes(facts)
    if PROCESSOR_CLASS in classes:
        return facts.kind in (None, Kind.DENSE)
    return facts.kind == Kind.DENSE and qwen2_5_vl_base(facts) and not multi_vector(classes)


def multi_vector(classes: set[str]) -> bool:
    """colpali-engine's multi-vector processors (ColQwen2, ColQwen2.5, ...): never a BiQwen2.5."""
    return any(name.startswith("Col") for name in classes)


def _bi_asked_otherwise(facts: Facts) -> bool:
    return adapter_only(facts) and PROCESSOR_CLASS in processor_classes(facts) and facts.kind not in (None, Kind.DENSE)


def _base_model_unused(facts: Facts) -> bool:
    return facts.base_model is not None and not is_nomic_multimodal(facts) and not _bi_asked_otherwise(facts)


def _base_model_message(facts: Facts) -> str:
    classes = processor_classes(facts)
    if adapter_only(facts) and multi_vector(classes):
        what = (
            f"a multi-vector adapter ({', '.join(sorted(classes))}), which is not served with its base: serve the "
            "merged checkpoint in transformers' layout (ColQwen2ForRetrieval, the '-hf' repositories)"
        )
    elif adapter_only(facts):
        what = (
            "a PEFT adapter that is not BiQwen2.5's (its processor files name "
            f"{', '.join(sorted(classes)) or 'no processor class'}; `kind: dense` serves an adapter of Qwen2.5-VL "
            "as nomic-embed-multimodal)"
        )
    else:
        what = "a whole model, not a PEFT adapter directory (adapter_config.json without config.json)"
    return (
        f"`base_model` ({facts.base_model}) is the base of nomic-embed-multimodal's PEFT adapter directory; "
        f"{facts.root} holds {what}"
    )


FAMILY = Family(
    name="nomic_multimodal",
    kind=Kind.DENSE,
    adapter="model_registry.adapters.nomic_multimodal:NomicMultimodalAdapter",
    capabilities=frozenset({Capability.EMBED_TEXT, Capability.EMBED_IMAGE}),
    summary="nomic-embed-multimodal (colpali-engine's BiQwen2.5): a LoRA adapter merged into its Qwen2.5-VL "
    "base (`base_model`); texts and page images in one space",
    reference="colpali-engine's `BiQwen2_5` / `BiQwen2_5_Processor` (transformers' Qwen2.5-VL, the adapter merged "
    "by PEFT; last token)",
    layout="model_registry.detection.peft_base:nomic_multimodal_layout",
    rules=(
        Rule(
            "bi-qwen2.5-not-dense",
            "layout",
            _bi_asked_otherwise,
            "refused: a BiQwen2.5 adapter (nomic-embed-multimodal) asked to be another kind than `dense`",
            order=64,
            refusal=lambda f: (
                f"{f.root} holds a BiQwen2.5 adapter (nomic-embed-multimodal, processor_class {PROCESSOR_CLASS}), "
                f"a dense embedder of texts and images; the entry asks for kind '{f.kind_name()}'. Set `kind: dense` "
                "or leave `kind` out"
            ),
        ),
        Rule(
            "nomic-multimodal-adapter",
            "layout",
            is_nomic_multimodal,
            "nomic-embed-multimodal: a PEFT adapter alone whose processor files say `BiQwen2_5_Processor` (or "
            "`kind: dense` on an adapter of Qwen2.5-VL), merged into its `base_model` by "
            "`adapters/nomic_multimodal.py`",
            order=65,
            family="nomic_multimodal",
        ),
        Rule(
            "base-model-unused",
            "layout",
            _base_model_unused,
            "refused: `base_model` on a directory that is not nomic-embed-multimodal's PEFT adapter",
            order=66,
            refusal=_base_model_message,
        ),
    ),
)
