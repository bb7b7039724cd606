"""Adapters, one model family per module, chosen by the model's kind.

Modules that import torch are imported only when a model of their kind is created.
"""

from __future__ import annotations

import importlib
from typing import Any

from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.config import ModelSpec
from model_registry.errors import ModelUnavailable
from model_registry.types import Kind

__all__ = ["Adapter", "LoadOptions", "create_adapter"]

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

#: Layouts served by another adapter than their kind's default (model_type -> "module:class").
LAYOUT_FACTORIES: dict[str, str] = {
    "open_clip": "model_registry.adapters.open_clip:OpenClipAdapter",
}


def _import(target: str) -> Any:
    module, _, name = target.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as error:
        raise ModelUnavailable(
            f"the backend for this model is not installed ({error.name}); install the project with its "
            "'torch' extra: pip install 'infinity-server[torch]'"
        ) from error


def create_adapter(spec: ModelSpec) -> Adapter:
    """Resolve the source, detect the layout and build the adapter (weights not loaded yet)."""
    if spec.kind == Kind.FAKE:
        from model_registry.adapters.fake import FakeAdapter

        return FakeAdapter(spec.options)
    from model_registry.detect import detect
    from model_registry.sources import resolve_source

    layout = detect(resolve_source(spec.source, revision=spec.revision), spec)
    if layout.kind not in FACTORIES:
        served = ", ".join(sorted(k.value for k in FACTORIES))
        raise ModelUnavailable(f"models of kind '{layout.kind.value}' are not supported yet; supported: {served}")
    target = LAYOUT_FACTORIES.get(layout.model_type, FACTORIES[layout.kind])
    adapter: Adapter = _import(target)(layout, spec.trust_remote_code)
    return adapter
