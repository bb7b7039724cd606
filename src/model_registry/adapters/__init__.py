"""Adapters, one model family per module, chosen by the family each declares (`families`).

Modules that import torch are imported only when a model of their kind is created.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
from typing import TYPE_CHECKING, Any

from model_registry import families
from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.config import ModelSpec
from model_registry.errors import ModelUnavailable
from model_registry.families import capabilities_of_kind
from model_registry.types import Capability, Kind

if TYPE_CHECKING:
    from model_registry.detection.layout import Layout

__all__ = ["Adapter", "LoadOptions", "capabilities_of_kind", "create_adapter", "detect_kind", "detect_served"]


def detect_kind(spec: ModelSpec) -> Kind:
    """The kind of a model from its files alone: no weights read, no backend imported, no download.

    A hub model that is not in the local cache yet is `ModelUnavailable` here (it downloads on load).
    """
    return _layout_of(spec).kind


def detect_served(spec: ModelSpec) -> tuple[Kind, frozenset[Capability]]:
    """The kind of a model and what it can do, from its files alone (as `detect_kind`): the
    capabilities of the family that serves it, where it declares its own, else its kind's."""
    layout = _layout_of(spec)
    family = families.by_name(layout.family) if layout.family else None
    if family is not None and family.capabilities:
        return layout.kind, family.capabilities
    return layout.kind, capabilities_of_kind(layout.kind)


def _layout_of(spec: ModelSpec) -> Layout:
    from pathlib import Path

    from model_registry.detection.layout import detect
    from model_registry.zoo.sources import find_in_cache, resolve_source

    source = spec.source
    if not source.startswith("package:") and not Path(source).expanduser().is_dir():
        repo, _, pinned = source.partition("@")
        cached = find_in_cache(repo, pinned or spec.revision)
        if cached is None:
            raise ModelUnavailable(f"'{source}' is not downloaded yet")
        source = str(cached)
    return detect(resolve_source(source, revision=spec.revision), spec)


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
    """transformers' model, configuration and tokenizer code, imported once (after: no-ops).

    Its model code imports torchao wherever torchao is installed (the `fp8` extra), for checkpoints
    saved quantized by torchao, which this server does not serve; the import takes most of a
    second and logs two deprecation warnings at every start. So transformers is told torchao is
    absent while its model code is imported: the fp8 engine imports torchao itself
    (`backends.torch.fp8`), only for a model that asks for fp8."""
    import transformers.utils
    import transformers.utils.import_utils as found

    modules = [m for m in (transformers.utils, found) if hasattr(m, "is_torchao_available")]
    kept = [getattr(m, "is_torchao_available") for m in modules]  # noqa: B009 - not in every release
    try:
        for module in modules:
            setattr(module, "is_torchao_available", _absent)  # noqa: B010
        import transformers.modeling_utils
        from transformers import AutoConfig, AutoModel, AutoTokenizer  # noqa: F401
    finally:
        for module, function in zip(modules, kept, strict=True):
            setattr(module, "is_torchao_available", function)  # noqa: B010


def _absent(*args: Any, **kwargs: Any) -> bool:
    return False


def create_adapter(spec: ModelSpec) -> Adapter:
    """Resolve the source, detect the layout and build the adapter (weights not loaded yet)."""
    if spec.kind == Kind.FAKE:
        from model_registry.adapters.fake import FakeAdapter

        return FakeAdapter(spec.options)  # no files to detect
    from model_registry.backends.torch.fp8 import check_kind
    from model_registry.detection.layout import detect
    from model_registry.zoo.sources import resolve_source

    layout = detect(resolve_source(spec.source, revision=spec.revision), spec)
    if families.default_of(layout.kind) is None and layout.family is None:
        served = ", ".join(sorted(f.kind.value for f in families.declared() if f.default and f.kind))
        raise ModelUnavailable(f"models of kind '{layout.kind.value}' are not supported yet; supported: {served}")
    if spec.quantize == "fp8":  # media adapters never see the engine choice that checks it for text
        try:
            check_kind(spec.name, layout.kind.value)
        except ValueError as error:
            raise ModelUnavailable(str(error)) from None
    return adapter_for(layout)


def adapter_for(layout: Layout) -> Adapter:
    """The adapter of a detected layout (a Router's routes each get theirs), weights not loaded."""
    family = families.by_name(layout.family) if layout.family else families.default_of(layout.kind)
    assert family is not None, f"This is a bug: no family serves kind {layout.kind.value}"
    engineless = families.engineless()
    # A Router is as light as its routes: its own module imports nothing heavy.
    light = family.engineless or (bool(layout.routes) and all(r.family in engineless for r in layout.routes.values()))
    target = family.adapter
    if not light and family.without_torch is not None and not torch_installed():
        target, light = family.without_torch, True
    # Only a checkpoint whose own code is needed runs it; a native port runs transformers' code.
    adapter: Adapter = _import(target, light=light)(layout, layout.remote_code)
    return adapter


def torch_installed() -> bool:
    """Whether torch can be imported (found, not imported: the light install has none)."""
    return importlib.util.find_spec("torch") is not None
