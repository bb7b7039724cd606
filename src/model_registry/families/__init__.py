"""The model families: each module of this package declares one `Family` as `FAMILY`, and so may
an installed package, through the `model_registry.families` entry point group.

Everything else that knows families reads them here: detection (`detection.rules`), the adapter a
layout gets and what a kind can do (`adapters`), and the docs' family table. Adding a family is
one module: its declaration and its adapter (docs/families.md).
"""

from __future__ import annotations

import functools
import pkgutil

from model_registry.backends import declarations
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


@functools.cache
def declared() -> tuple[Family, ...]:
    """Every family: this package's modules by name, then the installed entry points'."""
    modules = sorted(info.name for info in pkgutil.iter_modules(__path__) if info.name not in _NOT_FAMILIES)
    found = declarations(__name__, modules, ENTRY_POINTS, "FAMILY", Family, "model family")
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
