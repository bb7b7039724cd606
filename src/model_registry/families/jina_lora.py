"""jina-embeddings-v3: XLM-R with LoRA task adapters, the task chosen per request."""

from __future__ import annotations

from model_registry.families.base import Facts, Family, Rule
from model_registry.families.ports import is_jina_lora as is_published_jina
from model_registry.families.ports import jina_port, unapplied_adapters
from model_registry.types import Capability, Kind


def _jina_hf_adapters(facts: Facts) -> bool:
    return facts.model_type == "jina_embeddings_v3" and bool(unapplied_adapters(facts.transformer_dir))


def _jina_hf_message(facts: Facts) -> str:
    return (
        f"{facts.root} is a jina-embeddings-v3 conversion (model_type jina_embeddings_v3) with task adapters "
        f"({'; '.join(unapplied_adapters(facts.transformer_dir))}) that transformers' jina_embeddings_v3 port does "
        "not apply: its vectors would be the base model's, no task's. Serve the published layout "
        "(jinaai/jina-embeddings-v3, XLMRobertaLoRA), whose adapters this server applies per request, or a "
        "directory without the adapters to serve the base weights"
    )


def is_jina_lora(facts: Facts) -> bool:
    """jina-embeddings-v3 as published, which transformers' port serves with its task adapters."""
    return is_published_jina(facts.config) and jina_port() is not None


def _kind_message(facts: Facts) -> str:
    return (
        f"{facts.root} holds jina-embeddings-v3 (XLM-R with LoRA task adapters), an embedder: it is served as kind "
        f"dense only, not {facts.kind_name()}"
    )


FAMILY = Family(
    name="jina_lora",
    kind=Kind.DENSE,
    adapter="model_registry.adapters.jina_lora:JinaLoraAdapter",
    capabilities=frozenset({Capability.EMBED_TEXT}),
    summary="jina-embeddings-v3 as published (XLMRobertaLoRA), its task adapters applied per request",
    reference="the checkpoint's own code (`trust_remote_code`) with `task=`",
    engines=("torch", "onnx"),
    rules=(
        Rule(
            "jina-hf-adapters",
            "code",
            _jina_hf_adapters,
            "refused: a jina_embeddings_v3 conversion carrying task adapters its port does not apply",
            order=10,
            refusal=_jina_hf_message,
        ),
        Rule(
            "jina-lora-port",
            "code",
            is_jina_lora,
            "transformers' jina_embeddings_v3 port runs jina-embeddings-v3 as published (XLMRobertaLoRA), without "
            "`trust_remote_code`, its LoRA task adapters applied per request",
            order=30,
            remote=False,
            port=True,
            note=lambda f: (
                "transformers' native jina_embeddings_v3 port with the checkpoint's LoRA task adapters "
                "(the checkpoint's hub code is not run)"
            ),
        ),
        Rule(
            "jina-lora-not-dense",
            "family",
            lambda f: is_jina_lora(f) and f.kind != Kind.DENSE,
            "refused: jina-embeddings-v3 with a kind other than `dense`",
            order=20,
            refusal=_kind_message,
        ),
        Rule(
            "jina-lora",
            "family",
            is_jina_lora,
            "jina-embeddings-v3's task adapters, chosen per request (`adapters/jina_lora.py`)",
            order=21,
            family="jina_lora",
        ),
    ),
)
