"""Configuration validation: every mistake names the key, the value and what is accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_registry import ConfigError, load_config
from model_registry.config import parse_budget, registry_config


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


def test_a_queue_shorter_than_the_largest_request_is_refused() -> None:
    model = {"name": "m", "source": "fake", "kind": "fake", "max_queued_items": 100}
    with pytest.raises(ConfigError, match=r"models\.0\.max_queued_items is 100, below max_inputs_per_request \(2048\)"):
        registry_config({"models": [model]})
    assert registry_config({"models": [model], "max_inputs_per_request": 100}).models[0].max_queued_items == 100
