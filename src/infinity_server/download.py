"""`infinity-server download`: put every configured model where a server start will find it.

Used to bake weights into an image or to fill a volume (an init container) ahead of time, so
that pods never need the hub when they start. Hub models are fetched into the Hugging Face cache
(`HF_HUB_CACHE`, `HF_HOME`, or `~/.cache/huggingface/hub`; the same place the server looks);
local directories and `package:` sources are only checked, since there is nothing to fetch. A
PEFT adapter published without its base model (nomic-embed-multimodal) has its base fetched too.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from model_registry import fetch_base, find_in_cache, resolve_source
from model_registry.config import ModelSpec
from model_registry.errors import ConfigError, ModelUnavailable


class Outcome(enum.Enum):
    CACHED = "already in the cache"
    DOWNLOADED = "downloaded"
    LOCAL = "local directory, nothing to fetch"
    PACKAGE = "Python package, nothing to fetch"
    FAILED = "failed"


@dataclass(frozen=True)
class Fetched:
    """What `download` did for one model: the outcome, the directory, or why it failed."""

    name: str
    source: str
    outcome: Outcome
    path: Path | None = None
    error: str | None = None
    base: Path | None = None  # an adapter's base model, fetched with it


def _hub_reference(spec: ModelSpec) -> tuple[str, str | None] | None:
    """(repo, revision) when the source is a hub id, else None (a path or a package)."""
    if spec.source.startswith("package:") or Path(spec.source).expanduser().is_dir():
        return None
    repo, _, pinned = spec.source.partition("@")
    return repo, pinned or spec.revision


def fetch(spec: ModelSpec) -> Fetched:
    """Make one model's files available locally; never raises for an unavailable model."""
    hub = _hub_reference(spec)
    cached = find_in_cache(*hub) if hub else None
    try:
        # resolve_source checks packages and directories, and downloads a hub id that is not cached
        # (or fails clearly when HF_HUB_OFFLINE forbids it).
        path = resolve_source(spec.source, revision=spec.revision)
        base = fetch_base(path, spec)
    except (ModelUnavailable, ConfigError) as error:
        return Fetched(spec.name, spec.source, Outcome.FAILED, error=str(error))
    if hub is None:
        outcome = Outcome.PACKAGE if spec.source.startswith("package:") else Outcome.LOCAL
    else:
        outcome = Outcome.CACHED if cached is not None else Outcome.DOWNLOADED
    return Fetched(spec.name, spec.source, outcome, path=path, base=base)


def download_all(specs: Iterable[ModelSpec], report: Callable[[Fetched], None] = lambda _: None) -> list[Fetched]:
    """Fetch every model in turn (a failure does not stop the others); `report` sees each result."""
    results = []
    for spec in specs:
        result = fetch(spec)
        report(result)
        results.append(result)
    return results


def describe(result: Fetched) -> str:
    """One line per model for the command's output."""
    if result.outcome is Outcome.FAILED:
        return f"{result.name}\t{result.source}\tFAILED: {result.error}"
    line = f"{result.name}\t{result.source}\t{result.outcome.value}\t{result.path}"
    return line if result.base is None else f"{line}\tbase model {result.base}"
