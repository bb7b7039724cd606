"""Engine choice for the text adapters, and the start-up check of every configured model.

Reads each non-torch model's files (its kind and `config.json`) when the registry is built, so
that a combination no engine runs stops the server at start with a message naming the model, the
combination and the fix, instead of failing its first request.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from pathlib import Path

from model_registry import families
from model_registry.adapters.base import LoadOptions
from model_registry.backends.choice import Choice, choices
from model_registry.config import ModelSpec
from model_registry.detection.layout import Layout
from model_registry.errors import ConfigError, RegistryError


def engine_for(name: str, options: LoadOptions | ModelSpec, layout: Layout, cuda: bool) -> Choice:
    """The engine a model of `layout` runs on, `cuda` or not (`device: mps` counts as its own
    device); a bad combination is a `ConfigError`."""
    return engines_for(name, options, layout, cuda)[0]


def engines_for(name: str, options: LoadOptions | ModelSpec, layout: Layout, cuda: bool) -> tuple[Choice, ...]:
    """The engines to try for a model of `layout`, in order (`backends.choice.choices`)."""
    device = "cuda" if cuda else "cpu" if options.device in ("auto", "cpu") else options.device
    try:
        kind = layout.kind.value
        return choices(name, options.backend, options.quantize, kind, layout.config, device, dtype=options.dtype)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def check_engines(specs: Iterable[ModelSpec]) -> None:
    """Raise `ConfigError` for the first model whose files rule out its engine configuration.

    Models on torch, models on `auto` without int8 (auto falls back to torch), fp8 aside (its kinds
    are checked here), and models whose files are not on this machine yet (a hub id not
    downloaded) are checked when they load instead. A static embedding model runs on no engine:
    an engine key in its entry is refused here wherever its files are on this machine already."""
    from model_registry import adapters
    from model_registry.adapters.static import refused_settings
    from model_registry.detection.layout import detect
    from model_registry.zoo.sources import resolve_source

    light = not adapters.torch_installed()
    for spec in specs:
        refused = refused_settings(spec.backend, spec.quantize, spec.dtype, spec.device, spec.cuda_graphs)
        if refused is not None and _static(spec):
            raise ConfigError(f"model '{spec.name}': {refused}")
        if light:
            _check_without_torch(spec)
        _check_base_model(spec)
        if spec.quantize != "fp8" and (spec.backend == "torch" or (spec.backend == "auto" and spec.quantize == "none")):
            continue
        try:
            layout = detect(resolve_source(spec.source, revision=spec.revision), spec)
        except RegistryError:
            continue
        if layout.family in families.engineless():  # its files came with the download above
            raise ConfigError(f"model '{spec.name}': {refused}")
        engine_for(spec.name, spec, layout, cuda=spec.device.startswith("cuda"))


def _here(spec: ModelSpec) -> Path | None:
    """The model's directory where its files are on this machine already (None: a hub id not
    downloaded yet, which is not downloaded here)."""
    from model_registry.zoo.sources import find_in_cache, resolve_source

    source = spec.source
    if source.startswith("package:") or Path(source).expanduser().is_dir():
        return resolve_source(source, revision=spec.revision)
    repo, _, pinned = source.partition("@")
    return find_in_cache(repo, pinned or spec.revision)


def _static(spec: ModelSpec) -> bool:
    """Whether the model's files are an engineless family's (static embeddings), read where they are on this machine
    already (no download, and no more of them than the detection rules' layout stage reads)."""
    from model_registry.detection import rules
    from model_registry.detection.layout import read_facts

    try:
        root = _here(spec)
        claimed = None if root is None else rules.first(read_facts(root, spec), "layout")
    except (RegistryError, OSError, ValueError):  # unreadable files are the load's to report
        return False
    return claimed is not None and claimed.family in families.engineless()


def _check_base_model(spec: ModelSpec) -> None:
    """A PEFT adapter directory on this machine that a family serves with its base model (the
    layout stage claims it), whose base is neither here nor to be downloaded, is a `ConfigError`
    naming the model, the base and the `base_model` setting."""
    from model_registry.detection import peft_base, rules
    from model_registry.detection.layout import read_facts

    try:
        root = _here(spec)
        claimed = None if root is None else rules.first(read_facts(root, spec), "layout")
    except (RegistryError, OSError, ValueError):  # unreadable or refused files are the load's to report
        return
    if root is None or claimed is None or claimed.family is None or not (root / "adapter_config.json").is_file():
        return
    if peft_base.needs_download(root, spec):  # the load downloads it, as it does a hub `source`
        return
    try:
        peft_base.base_directory(root, spec, download=False)
    except RegistryError as error:
        raise ConfigError(str(error)) from None


def _check_without_torch(spec: ModelSpec) -> None:
    """Where torch is not installed: a model whose files are here and that needs it (a family
    without a torch-free adapter, an engine other than ONNX Runtime, a model that ships no ONNX
    graph) is a `ConfigError` naming the extra that serves it."""
    from model_registry.detection.layout import detect

    try:
        root = _here(spec)
        layout = None if root is None else detect(root, spec)
    except (RegistryError, OSError, ValueError):  # unreadable files are the load's to report
        return
    if layout is None:
        return
    family = families.by_name(layout.family) if layout.family else families.default_of(layout.kind)
    engineless = families.engineless()
    if (
        family is None
        or family.engineless
        or (layout.routes and all(r.family in engineless for r in layout.routes.values()))
    ):
        return
    kind = layout.kind.value
    said = f"model '{spec.name}' ({kind if family.name == kind else f'{family.name}, {kind}'})"
    if family.without_torch is None:
        raise ConfigError(f"{said} runs on torch, which is not installed: pip install 'infinity-server[torch]'")
    if spec.backend not in ("auto", "onnx"):
        raise ConfigError(
            f"{said}: backend: {spec.backend} needs torch, which is not installed: pip install "
            "'infinity-server[torch]' (without torch, a model runs on its own ONNX graph: backend: auto or onnx)"
        )
    if importlib.util.find_spec("onnxruntime") is None:
        raise ConfigError(
            f"{said} needs torch, or ONNX Runtime to run the ONNX graph it ships: pip install "
            "'infinity-server[onnx]' (models that ship onnx/model.onnx) or 'infinity-server[torch]'"
        )
    from model_registry.backends.onnx.engine import own_candidates, own_names

    if not own_candidates(layout.transformer_dir, spec.quantize, False):
        raise ConfigError(
            f"{said}: {layout.transformer_dir} ships no {own_names(spec.quantize, False)}, and exporting one needs "
            "torch: pip install 'infinity-server[onnx-export]'"
        )
