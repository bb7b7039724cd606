"""Engine choice for the text adapters, and the start-up check of every configured model.

Reads each non-torch model's files (its kind and `config.json`) when the registry is built, so
that a combination no engine runs stops the server at start with a message naming the model, the
combination and the fix, instead of failing its first request.
"""

from __future__ import annotations

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
    from model_registry.adapters.static import refused_settings
    from model_registry.detection.layout import detect
    from model_registry.zoo.sources import resolve_source

    for spec in specs:
        refused = refused_settings(spec.backend, spec.quantize, spec.dtype, spec.device, spec.cuda_graphs)
        if refused is not None and _static(spec):
            raise ConfigError(f"model '{spec.name}': {refused}")
        if spec.quantize != "fp8" and (spec.backend == "torch" or (spec.backend == "auto" and spec.quantize == "none")):
            continue
        try:
            layout = detect(resolve_source(spec.source, revision=spec.revision), spec)
        except RegistryError:
            continue
        if layout.family in families.engineless():  # its files came with the download above
            raise ConfigError(f"model '{spec.name}': {refused}")
        engine_for(spec.name, spec, layout, cuda=spec.device.startswith("cuda"))


def _static(spec: ModelSpec) -> bool:
    """Whether the model's files are an engineless family's (static embeddings), read where they are on this machine
    already (no download, and no more of them than the detection rules' layout stage reads)."""
    from model_registry.detection import rules
    from model_registry.detection.layout import read_facts
    from model_registry.zoo.sources import find_in_cache, resolve_source

    source = spec.source
    try:
        if source.startswith("package:") or Path(source).expanduser().is_dir():
            root: Path | None = resolve_source(source, revision=spec.revision)
        else:
            repo, _, pinned = source.partition("@")
            root = find_in_cache(repo, pinned or spec.revision)
        claimed = None if root is None else rules.first(read_facts(root, spec), "layout")
    except (RegistryError, OSError, ValueError):  # unreadable files are the load's to report
        return False
    return claimed is not None and claimed.family in families.engineless()
