"""The model families: each module of this package declares one `Family` as `FAMILY`, and so may
an installed package, through the `model_registry.families` entry point group.

Everything else that knows families reads them here: detection (`detection.rules`), the adapter a
layout gets and what a kind can do (`adapters`), and the docs' family table. Adding a family is
one module: its declaration and its adapter (docs/families.md).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import pkgutil
from types import ModuleType

from model_registry.errors import ConfigError
from model_registry.families.base import STAGES, Facts, Family, Rule, Stage
from model_registry.types import Capability, Kind

__all__ = [
    "STAGES",
    "Facts",
    "Family",
    "Rule",
    "Stage",
    "by_name",
    "capabilities_of_kind",
    "declared",
    "default_of",
    "engineless",
]

#: Installed packages declare families of their own under this entry point group, each entry
#: naming a module with a `FAMILY`.
ENTRY_POINTS = "model_registry.families"
#: The package's modules that are not families: the declarations' types, transformers' ports of hub-code families.
_NOT_FAMILIES = frozenset({"base", "ports"})


def _family_of(found: object, where: str) -> Family:
    family = getattr(found, "FAMILY", None) if isinstance(found, ModuleType) else found
    if not isinstance(family, Family):
        raise ConfigError(f"{where} declares no model family (a `FAMILY = Family(...)`)")
    return family


@functools.cache
def declared() -> tuple[Family, ...]:
    """Every family: this package's modules by name, then the installed entry points'."""
    found = [
        _family_of(importlib.import_module(f"{__name__}.{info.name}"), f"{__name__}.{info.name}")
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name)
        if info.name not in _NOT_FAMILIES
    ]
    for entry in sorted(importlib.metadata.entry_points(group=ENTRY_POINTS), key=lambda e: e.name):
        where = f"entry point '{entry.name}' ({entry.value}) of group {ENTRY_POINTS}"
        try:
            loaded = entry.load()
        except ImportError as error:
            raise ConfigError(f"{where} cannot be imported: {error}") from error
        except ValueError as error:  # a declaration that contradicts itself (`Family.__post_init__`)
            raise ConfigError(f"{where}: {error}") from error
        found.append(_family_of(loaded, where))
    names = [family.name for family in found]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"model families declared twice: {', '.join(twice)}")
    kinds = [family.kind for family in found if family.default]
    if len(kinds) != len(set(kinds)):
        raise ConfigError("a kind has two default families")
    return tuple(found)


def by_name(name: str) -> Family:
    return next(family for family in declared() if family.name == name)


def default_of(kind: Kind) -> Family | None:
    """The family that serves `kind` unless a rule names another."""
    return next((family for family in declared() if family.default and family.kind == kind), None)


def capabilities_of_kind(kind: Kind) -> frozenset[Capability]:
    """What a model of `kind` can do, known before it loads: its default family's capabilities."""
    family = default_of(kind)
    return family.capabilities if family else frozenset()


def engineless() -> frozenset[str]:
    """The families computed on numpy and tokenizers alone."""
    return frozenset(family.name for family in declared() if family.engineless)


def rules() -> tuple[Rule, ...]:
    """Every family's detection rules, in declaration order."""
    return tuple(rule for family in declared() for rule in family.rules)
