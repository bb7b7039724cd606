"""The configuration shown in the README is valid."""

from __future__ import annotations

import re
from pathlib import Path

from infinity_server.settings import load_settings

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
