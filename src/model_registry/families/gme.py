"""GME (Alibaba-NLP/gme-Qwen2-VL-2B-Instruct, -7B-Instruct): one Qwen2-VL model embeds texts and
images into one space.

As published, `config.json` says `Qwen2VLForConditionalGeneration` (model_type `qwen2_vl`), as
Qwen2-VL's chat models do; what tells GME apart is its reference code, `gme_inference.py`, beside
the weights. Qwen2-VL files without it are refused unless the entry says `kind: dense`, which
serves them with GME's recipe (`adapters/gme.py`). GME's own code is never run: the config's
`auto_map` or a modules.json module naming it does not ask for `trust_remote_code`."""

from __future__ import annotations

from model_registry.families.base import Facts, Family, Rule
from model_registry.types import Capability, Kind

MODEL_TYPE = "qwen2_vl"
#: The reference code GME publishes beside its weights.
REFERENCE_CODE = "gme_inference.py"


def _qwen2_vl(facts: Facts) -> bool:
    return facts.model_type == MODEL_TYPE


def is_gme(facts: Facts) -> bool:
    """Qwen2-VL files that GME's reference code sits beside, or that the entry calls `kind: dense`."""
    if not _qwen2_vl(facts):
        return False
    if facts.kind is not None:
        return facts.kind == Kind.DENSE
    return facts.has(REFERENCE_CODE)


def _not_served(facts: Facts) -> bool:
    return _qwen2_vl(facts) and not is_gme(facts)


def _message(facts: Facts) -> str:
    what = ", ".join(facts.architectures) or facts.model_type
    if facts.kind is None:
        why = (
            f"its files do not say it embeds: GME's carry its reference code ({REFERENCE_CODE}) beside the weights, "
            "and these do not. Set `kind: dense` to serve them as GME (its instruction, prompt layout and last-token "
            "pooling)"
        )
    else:
        why = f"Qwen2-VL is served as GME only (`kind: dense`, or {REFERENCE_CODE} beside the weights)"
    asked = f" as kind '{facts.kind.value}'" if facts.kind is not None else ""
    return (
        f"{facts.root} holds a vision-language model ({what}, model_type {facts.model_type}) that this server "
        f"does not serve{asked}: {why}. Qwen2-VL's chat models are not served"
    )


FAMILY = Family(
    name="gme",
    kind=Kind.DENSE,
    adapter="model_registry.adapters.gme:GmeAdapter",
    capabilities=frozenset({Capability.EMBED_TEXT, Capability.EMBED_IMAGE}),
    summary=(
        "GME (gme-Qwen2-VL): texts, images (256-1,280 visual tokens) and both fused in one space, "
        "its instruction as system"
    ),
    reference="the model's `gme_inference.py` (`GmeQwen2VL`: transformers' Qwen2-VL, last token)",
    model_types=frozenset({MODEL_TYPE}),
    rules=(
        Rule(
            "qwen2-vl-not-gme",
            "layout",
            _not_served,
            f"refused: a Qwen2-VL model without GME's `{REFERENCE_CODE}` or `kind: dense` (a chat model)",
            order=88,
            refusal=_message,
        ),
        Rule(
            "gme-own-code",
            "code",
            lambda f: is_gme(f) and bool(f.remote_classes()),
            "GME's own code (`auto_map`, a modules.json module) is not run: `adapters/gme.py` follows it",
            remote=False,
            note=lambda f: "GME's recipe in adapters/gme.py (the checkpoint's own code is not run)",
            order=19,
        ),
        Rule(
            "gme",
            "family",
            is_gme,
            "GME, served by `adapters/gme.py`",
            order=31,
            family="gme",
        ),
    ),
)
