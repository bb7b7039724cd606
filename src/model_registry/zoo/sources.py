"""A model reference -> a local directory.

Accepted references:
- a local directory path;
- `package:NAME` (a Python package that carries a model directory, found without importing it);
- a hub id `org/name` (optionally `org/name@revision`), looked up in the local Hugging Face cache
  (standard layout, no network) and downloaded through huggingface_hub only when the hub may be
  reached (`HF_HUB_OFFLINE` unset).
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from model_registry.errors import ConfigError, ModelUnavailable

_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
#: Files that make a directory a model's; a PEFT adapter published alone has adapter_config.json.
_MODEL_MARKERS = ("config.json", "modules.json", "open_clip_config.json", "adapter_config.json")


def resolve_source(source: str, *, revision: str | None = None) -> Path:
    """The directory holding the model's files. Raises `ModelUnavailable` when it cannot be had."""
    if source.startswith("package:"):
        return _package_dir(source.removeprefix("package:"))
    path = Path(source).expanduser()
    if path.is_dir():
        return path.resolve()
    repo, _, pinned = source.partition("@")
    if _HUB_ID.match(repo) and not source.startswith((".", "/", "~")):
        return _hub_dir(repo, pinned or revision)
    raise ModelUnavailable(
        f"the model source '{source}' is neither a directory, nor 'package:NAME', nor a hub id 'org/name'"
    )


def _looks_like_model(path: Path) -> bool:
    return any((path / marker).is_file() for marker in _MODEL_MARKERS)


def _package_dir(name: str) -> Path:
    if not name.isidentifier() and not all(part.isidentifier() for part in name.split(".")):
        raise ConfigError(f"'package:{name}' does not name a Python package")
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable(f"the Python package '{name}' is not installed (pip install {name.replace('_', '-')})")
    for location in spec.submodule_search_locations:
        root = Path(location)
        candidates = [root, root / "model", *sorted(p for p in root.iterdir() if p.is_dir())]
        for candidate in candidates:
            if _looks_like_model(candidate):
                return candidate.resolve()
    raise ModelUnavailable(f"the package '{name}' carries no model directory (no config.json or modules.json)")


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, honouring HF_HUB_CACHE and HF_HOME like huggingface_hub does."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def find_in_cache(repo: str, revision: str | None = None, cache: Path | None = None) -> Path | None:
    """The snapshot directory of `repo` at `revision` (a branch, tag or commit) if it is cached."""
    root = (cache or hub_cache_dir()) / ("models--" + repo.replace("/", "--"))
    if not root.is_dir():
        return None
    wanted = revision or "main"
    ref = root / "refs" / wanted
    commit = ref.read_text().strip() if ref.is_file() else wanted
    snapshot = root / "snapshots" / commit
    if snapshot.is_dir() and _looks_like_model(snapshot):
        return snapshot
    if revision is None:
        snapshots = [p for p in (root / "snapshots").glob("*") if p.is_dir() and _looks_like_model(p)]
        if len(snapshots) == 1:
            return snapshots[0]
    return None


def offline() -> bool:
    """Whether HF_HUB_OFFLINE keeps the hub from being reached."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _hub_dir(repo: str, revision: str | None) -> Path:
    cached = find_in_cache(repo, revision)
    if cached is not None:
        return cached
    if offline():
        raise ModelUnavailable(
            f"the hub model '{repo}' is not in the local cache ({hub_cache_dir()}) and HF_HUB_OFFLINE is set"
        )
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo, revision=revision))
    except Exception as error:  # any download failure makes the model unavailable, with its cause
        raise ModelUnavailable(f"the hub model '{repo}' could not be downloaded: {error}") from error
