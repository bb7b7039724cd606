"""A dense embedder with LoRA adapters in PEFT's format, listed by the model entry (`adapters`) and
chosen per request; batches never mix adapters."""

from __future__ import annotations

from pathlib import Path

from model_registry.families.base import Facts, Family, Rule
from model_registry.families.jina_lora import is_jina_lora
from model_registry.families.jina_v4 import is_jina_v4
from model_registry.families.static import is_static
from model_registry.types import Capability, Kind


def adapter_directory(model: Path, given: str) -> Path:
    """Where an adapter the entry lists lies: a relative path is inside the model's directory (an
    adapter published with the model), anything else as given."""
    path = Path(given).expanduser()
    return path if path.is_absolute() else model / path


def _elsewhere(facts: Facts) -> bool:
    return bool(facts.adapters) and (
        facts.kind != Kind.DENSE or is_jina_lora(facts) or is_jina_v4(facts) or is_static(facts)
    )


def _elsewhere_message(facts: Facts) -> str:
    what = "a static embedding model" if is_static(facts) else "jina-embeddings-v3, whose task adapters are its own"
    if is_jina_v4(facts):
        what = "jina-embeddings-v4, whose task adapters are its own (chosen per request by `task`)"
    if facts.kind != Kind.DENSE:
        what = f"a {facts.kind_name()} model"
    return (
        f"`adapters` (PEFT LoRA adapters chosen per request) apply to dense transformer embedders; {facts.root} "
        f"holds {what}"
    )


FAMILY = Family(
    name="peft_lora",
    kind=Kind.DENSE,
    adapter="model_registry.adapters.peft_lora:PeftLoraAdapter",
    capabilities=frozenset({Capability.EMBED_TEXT}),
    summary="a dense embedder with the entry's LoRA adapters (PEFT's format), one chosen per request",
    reference="PEFT `PeftModel.from_pretrained(...).merge_and_unload()` in sentence-transformers",
    engines=("torch",),
    rules=(
        Rule(
            "adapters-elsewhere",
            "family",
            _elsewhere,
            "refused: `adapters` on a model that is not a dense transformer embedder",
            order=5,
            refusal=_elsewhere_message,
        ),
        Rule(
            "peft-adapters",
            "family",
            lambda f: bool(f.adapters),
            "a dense embedder whose entry lists `adapters`: each request's adapter applied to its batch "
            "(`adapters/peft_lora.py`)",
            order=25,
            family="peft_lora",
        ),
    ),
)
