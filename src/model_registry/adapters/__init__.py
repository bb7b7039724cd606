"""Adapters, one model family per module, chosen by the model's kind.

Modules that import torch are imported only when a model of their kind is created.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
from typing import TYPE_CHECKING, Any

from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.config import ModelSpec
from model_registry.detect_rules import ENGINELESS
from model_registry.errors import ModelUnavailable
from model_registry.types import Capability, Kind

if TYPE_CHECKING:
    from model_registry.detect import Layout

__all__ = ["Adapter", "LoadOptions", "capabilities_of_kind", "create_adapter", "detect_kind"]

#: kind -> "module:class"; each class takes (layout, trust_remote_code).
FACTORIES: dict[Kind, str] = {
    Kind.DENSE: "model_registry.adapters.dense:DenseAdapter",
    Kind.RERANKER: "model_registry.adapters.sequence:RerankerAdapter",
    Kind.CLASSIFIER: "model_registry.adapters.sequence:ClassifierAdapter",
    Kind.SPARSE: "model_registry.adapters.splade:SpladeAdapter",
    Kind.MULTIVECTOR: "model_registry.adapters.colbert:ColbertAdapter",
    Kind.MULTI_OUTPUT: "model_registry.adapters.bge_m3:BgeM3Adapter",
    Kind.IMAGE_TEXT: "model_registry.adapters.clip:ClipAdapter",
    Kind.AUDIO_TEXT: "model_registry.adapters.clap:ClapAdapter",
    Kind.PAGE_TEXT: "model_registry.adapters.colpali:ColPaliAdapter",
}

_TEXT, _IMAGE, _AUDIO = Capability.EMBED_TEXT, Capability.EMBED_IMAGE, Capability.EMBED_AUDIO
#: kind -> what its adapter can do (each adapter class declares the same set), known before loading.
CAPABILITIES: dict[Kind, frozenset[Capability]] = {
    Kind.DENSE: frozenset({_TEXT}),
    Kind.RERANKER: frozenset({Capability.RERANK}),
    Kind.CLASSIFIER: frozenset({Capability.CLASSIFY}),
    Kind.SPARSE: frozenset({Capability.SPARSE}),
    Kind.MULTIVECTOR: frozenset({Capability.MULTIVECTOR}),
    Kind.MULTI_OUTPUT: frozenset({_TEXT, Capability.SPARSE, Capability.MULTIVECTOR}),
    Kind.IMAGE_TEXT: frozenset({_TEXT, _IMAGE}),
    Kind.AUDIO_TEXT: frozenset({_TEXT, _AUDIO}),
    Kind.PAGE_TEXT: frozenset({_TEXT, _IMAGE, Capability.MULTIVECTOR}),
    Kind.FAKE: frozenset({_TEXT}),
}


def capabilities_of_kind(kind: Kind) -> frozenset[Capability]:
    return CAPABILITIES.get(kind, frozenset())


def detect_kind(spec: ModelSpec) -> Kind:
    """The kind of a model from its files alone: no weights read, no backend imported, no download.

    A hub model that is not in the local cache yet is `ModelUnavailable` here (it downloads on load).
    """
    from pathlib import Path

    from model_registry.detect import detect
    from model_registry.sources import find_in_cache, resolve_source

    source = spec.source
    if not source.startswith("package:") and not Path(source).expanduser().is_dir():
        repo, _, pinned = source.partition("@")
        cached = find_in_cache(repo, pinned or spec.revision)
        if cached is None:
            raise ModelUnavailable(f"'{source}' is not downloaded yet")
        source = str(cached)
    return detect(resolve_source(source, revision=spec.revision), spec).kind


#: Families served by another adapter than their kind's default (`detect_rules`' family stage).
FAMILY_FACTORIES: dict[str, str] = {
    "open_clip": "model_registry.adapters.open_clip:OpenClipAdapter",
    "naflex": "model_registry.adapters.naflex:NaflexAdapter",
    "llm_reranker": "model_registry.adapters.llm_reranker:LlmRerankerAdapter",
    "jina_lora": "model_registry.adapters.jina_lora:JinaLoraAdapter",
    "static": "model_registry.adapters.static:StaticAdapter",
    "sparse_static": "model_registry.adapters.sparse_static:SparseStaticAdapter",
    "router": "model_registry.adapters.router:RouterAdapter",
}
#: Families whose adapters run on numpy and tokenizers alone: no torch, no transformers imported.
LIGHT_FAMILIES = ENGINELESS


#: Held while a load imports its adapter and, the first time, transformers' model code: transformers'
#: lazy modules imported from two load threads at once can hand one of them a module half
#: initialised ("cannot import name 'AutoConfig' from 'transformers'"), the likelier as that import
#: takes longer (seconds where torchao, the fp8 extra, is installed: transformers imports it then).
_importing = threading.Lock()


def _import(target: str, *, light: bool = False) -> Any:
    """The adapter class `target` names; unless `light`, with transformers' code imported once."""
    module, _, name = target.partition(":")
    try:
        with _importing:
            found = getattr(importlib.import_module(module), name)
            if not light and importlib.util.find_spec("transformers") is not None:
                _import_transformers()
        return found
    except ImportError as error:
        if light:
            raise ModelUnavailable(
                f"a package this model needs is not installed ({error.name}); reinstall the project: "
                "pip install infinity-server"
            ) from error
        raise ModelUnavailable(
            f"the backend for this model is not installed ({error.name}); install the project with its "
            "'torch' extra: pip install 'infinity-server[torch]'"
        ) from error


def _import_transformers() -> None:
    """transformers' model, configuration and tokenizer code, imported once (after: no-ops)."""
    import transformers.modeling_utils  # noqa: F401
    from transformers import AutoConfig, AutoModel, AutoTokenizer  # noqa: F401


def create_adapter(spec: ModelSpec) -> Adapter:
    """Resolve the source, detect the layout and build the adapter (weights not loaded yet)."""
    if spec.kind == Kind.FAKE:
        from model_registry.adapters.fake import FakeAdapter

        return FakeAdapter(spec.options)
    from model_registry.backends.fp8 import check_kind
    from model_registry.detect import detect
    from model_registry.sources import resolve_source

    layout = detect(resolve_source(spec.source, revision=spec.revision), spec)
    if layout.kind not in FACTORIES:
        served = ", ".join(sorted(k.value for k in FACTORIES))
        raise ModelUnavailable(f"models of kind '{layout.kind.value}' are not supported yet; supported: {served}")
    if spec.quantize == "fp8":  # media adapters never see the engine choice that checks it for text
        try:
            check_kind(spec.name, layout.kind.value)
        except ValueError as error:
            raise ModelUnavailable(str(error)) from None
    return adapter_for(layout)


def adapter_for(layout: Layout) -> Adapter:
    """The adapter of a detected layout (a Router's routes each get theirs), weights not loaded."""
    target = FAMILY_FACTORIES[layout.family] if layout.family else FACTORIES[layout.kind]
    # A Router is as light as its routes: its own module imports nothing heavy.
    light = layout.family in LIGHT_FAMILIES or (
        layout.family == "router" and all(r.family in LIGHT_FAMILIES for r in layout.routes.values())
    )
    # Only a checkpoint whose own code is needed runs it; a native port runs transformers' code.
    adapter: Adapter = _import(target, light=light)(layout, layout.remote_code)
    return adapter
