"""The configuration shown in the README is valid."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from infinity_server.settings import load_settings
from model_registry.config import ModelSpec

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_configuration_validates(tmp_path: Path) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README shows no YAML configuration"
    path = tmp_path / "models.yaml"
    path.write_text(blocks[0])
    settings = load_settings(path, environ={})
    assert [m.name for m in settings.registry.models] == ["minilm"]
    assert settings.registry.failed_retry_after == 30
    assert settings.server.port == 7997


def test_the_readme_model_entry_shows_the_defaults() -> None:
    """Every key of the README's model entry, but those an example sets for itself, is shown at
    its default (`backend: auto` among them)."""
    entry = yaml.safe_load(re.findall(r"```yaml\n(.*?)```", README.read_text(), flags=re.S)[0])["models"][0]
    own = {"name", "source", "pin", "max_batch_tokens"}  # the example's values; the comments give the defaults
    shown = {key: value for key, value in entry.items() if key not in own}
    assert shown["backend"] == "auto"
    assert shown == {key: ModelSpec.model_fields[key].default for key in shown}
