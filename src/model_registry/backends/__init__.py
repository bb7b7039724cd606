"""Backend engines: torch, ONNX Runtime, CTranslate2, one package each behind `base.Engine`.

Each package declares its `EngineFacts` as `ENGINE` in its `__init__` without importing the
engine itself; installed packages add engines through the `model_registry.engines` entry point
group. `create_engine` imports the one asked for, so that a server without the `onnx` or
`ctranslate2` extra still starts its torch models.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import pkgutil
from types import ModuleType

from model_registry.backends.base import Engine, EngineFacts
from model_registry.errors import ConfigError, ModelUnavailable

#: Installed packages declare engines of their own under this group, each entry naming a module
#: with an `ENGINE`.
ENTRY_POINTS = "model_registry.engines"


def _facts_of(found: object, where: str) -> EngineFacts:
    facts = getattr(found, "ENGINE", None) if isinstance(found, ModuleType) else found
    if not isinstance(facts, EngineFacts):
        raise ConfigError(f"{where} declares no engine (an `ENGINE = EngineFacts(...)`)")
    return facts


@functools.cache
def declared() -> tuple[EngineFacts, ...]:
    """Every engine: torch first (it serves every model, `auto`'s last resort), then this
    package's others by name, then the installed entry points'."""
    found = [
        _facts_of(importlib.import_module(f"{__name__}.{info.name}"), f"{__name__}.{info.name}")
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: (info.name != "torch", info.name))
        if info.ispkg
    ]
    for entry in sorted(importlib.metadata.entry_points(group=ENTRY_POINTS), key=lambda e: e.name):
        where = f"entry point '{entry.name}' ({entry.value}) of group {ENTRY_POINTS}"
        try:
            found.append(_facts_of(entry.load(), where))
        except ImportError as error:
            raise ConfigError(f"{where} cannot be imported: {error}") from error
    names = [facts.name for facts in found]
    if len(set(names)) != len(names) or "auto" in names:
        raise ConfigError(f"engines declared twice (or as 'auto'): {', '.join(names)}")
    return tuple(found)


def names() -> tuple[str, ...]:
    return tuple(facts.name for facts in declared())


def facts(name: str) -> EngineFacts:
    found = next((facts for facts in declared() if facts.name == name), None)
    if found is None:
        raise ConfigError(f"no engine '{name}'; the engines are {', '.join(names())}")
    return found


def create_engine(backend: str) -> Engine:
    """A fresh, unloaded engine; a missing extra is a `ModelUnavailable` naming the install command."""
    declared_facts = facts(backend)
    module, _, cls = declared_facts.implementation.partition(":")
    try:
        engine: Engine = getattr(importlib.import_module(module), cls)()
    except ImportError as error:
        raise ModelUnavailable(
            f"backend '{backend}' needs {error.name}, which is not installed; "
            f"pip install 'infinity-server[{declared_facts.extra}]'"
        ) from error
    return engine
