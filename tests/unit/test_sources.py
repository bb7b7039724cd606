"""Model sources: local directories, installed packages, the offline hub cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_registry import ModelUnavailable
from model_registry.zoo.sources import find_in_cache, resolve_source
from tests.builders.hub import lay_out_cache


def test_local_directory_and_missing_sources(tmp_path: Path) -> None:
    assert resolve_source(str(tmp_path)) == tmp_path.resolve()
    with pytest.raises(ModelUnavailable, match="not installed"):
        resolve_source("package:no_such_package_here")
    with pytest.raises(ModelUnavailable, match="neither a directory"):
        resolve_source("./does/not/exist")


def test_hub_ids_resolve_from_the_local_cache_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snapshot = lay_out_cache(tmp_path, "org/model", "abc123")
    lay_out_cache(tmp_path, "org/other", "def456", branch="v2")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_source("org/model") == snapshot
    assert find_in_cache("org/model", "abc123", tmp_path) == snapshot
    assert resolve_source("org/other@v2") == tmp_path / "models--org--other" / "snapshots" / "def456"
    with pytest.raises(ModelUnavailable, match="not in the local cache"):
        resolve_source("org/missing")
