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
from collections.abc import Iterable
from types import ModuleType
from typing import TypeVar

from model_registry.backends.base import Engine, EngineFacts
from model_registry.errors import ConfigError, ModelUnavailable

#: Installed packages declare engines of their own under this group, each entry naming a module
#: with an `ENGINE`.
ENTRY_POINTS = "model_registry.engines"
T = TypeVar("T")


def declarations(package: str, modules: Iterable[str], group: str, attribute: str, kind: type[T], what: str) -> list[T]:
    """`attribute` of each of `package`'s `modules`, in the order given, then of each installed
    entry point of `group` by name (a module holding it, or the declaration itself). One that
    cannot be imported, contradicts itself or declares no `kind` is a `ConfigError` naming it.
    Model families and engines are both found so."""

    def declared_by(found: object, where: str) -> T:
        value = getattr(found, attribute, None) if isinstance(found, ModuleType) else found
        if not isinstance(value, kind):
            raise ConfigError(f"{where} declares no {what} (a `{attribute} = {kind.__name__}(...)`)")
        return value

    found = [declared_by(importlib.import_module(f"{package}.{name}"), f"{package}.{name}") for name in modules]
    for entry in sorted(importlib.metadata.entry_points(group=group), key=lambda e: e.name):
        where = f"entry point '{entry.name}' ({entry.value}) of group {group}"
        try:
            loaded = entry.load()
        except ImportError as error:
            raise ConfigError(f"{where} cannot be imported: {error}") from error
        except ValueError as error:  # a declaration that contradicts itself (its `__post_init__`)
            raise ConfigError(f"{where}: {error}") from error
        found.append(declared_by(loaded, where))
    return found


@functools.cache
def declared() -> tuple[EngineFacts, ...]:
    """Every engine: torch first (it serves every model, `auto`'s last resort), then this
    package's others by name, then the installed entry points'."""
    packages = sorted((i.name for i in pkgutil.iter_modules(__path__) if i.ispkg), key=lambda n: (n != "torch", n))
    found = declarations(__name__, packages, ENTRY_POINTS, "ENGINE", EngineFacts, "engine")
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
