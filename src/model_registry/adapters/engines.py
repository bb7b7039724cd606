"""Engine choice for the text adapters, and the start-up check of every configured model.

Reads each non-torch model's files (its kind and `config.json`) when the registry is built, so
that a combination no engine runs stops the server at start with a message naming the model, the
combination and the fix, instead of failing its first request.
"""

from __future__ import annotations

from collections.abc import Iterable

from model_registry.adapters.base import LoadOptions
from model_registry.backends.choice import Choice, choices
from model_registry.config import ModelSpec
from model_registry.detect import Layout
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
    downloaded) are checked when they load instead."""
    from model_registry.detect import detect
    from model_registry.sources import resolve_source

    for spec in specs:
        if spec.quantize != "fp8" and (spec.backend == "torch" or (spec.backend == "auto" and spec.quantize == "none")):
            continue
        try:
            layout = detect(resolve_source(spec.source, revision=spec.revision), spec)
        except RegistryError:
            continue
        engine_for(spec.name, spec, layout, cuda=spec.device.startswith("cuda"))
