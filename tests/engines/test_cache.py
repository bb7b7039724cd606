"""The engine artifact cache: built once, rebuilt when corrupt, keyed by options, safe across
processes, and never a crash loop on a read-only directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from model_registry.backends import cache
from model_registry.backends.base import EncoderBatch, EngineOptions
from tests.builders.text import tiny_bert
from tests.conftest import REPO

pytest.importorskip("onnxruntime")

BUILDS = "builds.log"


def counting_build(log: Path, seconds: float = 0.0):  # type: ignore[no-untyped-def]
    def build(staging: Path) -> None:
        with log.open("a") as handle:
            handle.write(f"{os.getpid()}\n")
        time.sleep(seconds)
        (staging / "weights.bin").write_bytes(b"x" * 1000)

    return build


def test_second_lookup_does_not_build_again(tmp_path: Path) -> None:
    log = tmp_path / BUILDS
    first = cache.cached(tmp_path / "root", "onnx", "k1", counting_build(log))
    second = cache.cached(tmp_path / "root", "onnx", "k1", counting_build(log))
    assert first == second
    assert log.read_text().count("\n") == 1


def test_a_corrupt_or_unfinished_artifact_is_rebuilt(tmp_path: Path) -> None:
    log = tmp_path / BUILDS
    artifact = cache.cached(tmp_path / "root", "onnx", "k1", counting_build(log))
    (artifact / "weights.bin").write_bytes(b"y" * 1000)  # same size, other bytes
    assert not cache.is_complete(artifact)
    rebuilt = cache.cached(tmp_path / "root", "onnx", "k1", counting_build(log))
    assert (rebuilt / "weights.bin").read_bytes() == b"x" * 1000
    (rebuilt / cache.MANIFEST).unlink()  # an interrupted build leaves no manifest
    cache.cached(tmp_path / "root", "onnx", "k1", counting_build(log))
    assert log.read_text().count("\n") == 3


def test_the_key_changes_with_options_versions_and_weights(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"a" * 10)
    key = cache.artifact_key(model, {"onnxruntime": "1"}, {"quantize": "none"})
    assert key == cache.artifact_key(model, {"onnxruntime": "1"}, {"quantize": "none"})
    assert key != cache.artifact_key(model, {"onnxruntime": "1"}, {"quantize": "int8"})
    assert key != cache.artifact_key(model, {"onnxruntime": "2"}, {"quantize": "none"})
    (model / "model.safetensors").write_bytes(b"b" * 10)
    assert key != cache.artifact_key(model, {"onnxruntime": "1"}, {"quantize": "none"})


def test_two_processes_building_at_once_build_once_and_both_succeed(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from tests.engines.test_cache import counting_build; "
        "from model_registry.backends.cache import cached; "
        "p = cached(Path(sys.argv[1]), 'onnx', 'k1', counting_build(Path(sys.argv[2]), 1.0)); "
        "print((p / 'weights.bin').stat().st_size)"
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}
    args = [sys.executable, "-c", code, str(tmp_path / "root"), str(tmp_path / BUILDS)]
    running = [subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=60)[0].strip() for p in running]
    assert [p.returncode for p in running] == [0, 0]
    assert outputs == ["1000", "1000"]
    assert (tmp_path / BUILDS).read_text().count("\n") == 1


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes through read-only modes")
def test_a_read_only_cache_falls_back_to_a_temporary_directory(tmp_path: Path) -> None:
    root = tmp_path / "ro"
    root.mkdir()
    root.chmod(0o555)
    try:
        chosen = cache.writable_root(str(root))
        assert chosen != root
        assert os.access(chosen, os.W_OK)
    finally:
        root.chmod(0o755)


def test_an_unwritable_cache_path_falls_back_to_a_temporary_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    chosen = cache.writable_root(str(blocker / "cache"))  # mkdir under a file fails for everyone
    assert chosen != blocker / "cache"
    assert os.access(chosen, os.W_OK)


# ---- the real ONNX engine ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_bert(tmp_path_factory.mktemp("bert") / "bert")


def _hidden(directory: Path, root: Path, quantize: str = "none") -> tuple[np.ndarray, Path]:
    from model_registry.backends.onnx import OnnxEngine

    engine = OnnxEngine()
    engine.load(directory, EngineOptions(device="cpu", quantize=quantize, cache_dir=str(root)))
    ids = np.array([[2, 10, 11, 12, 3]], dtype=np.int64)
    hidden = engine.run(EncoderBatch(ids, np.ones_like(ids))).hidden
    assert engine.path is not None
    path = engine.path
    engine.release()
    return hidden, path


def test_onnx_export_is_cached_rebuilt_when_corrupt_and_keyed_by_options(bert: Path, tmp_path: Path) -> None:
    first, path = _hidden(bert, tmp_path)
    built = path.stat().st_mtime_ns
    again, same = _hidden(bert, tmp_path)
    assert same == path
    assert path.stat().st_mtime_ns == built, "the second load exported again"
    np.testing.assert_array_equal(first, again)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # a truncated file
    rebuilt, _ = _hidden(bert, tmp_path)
    np.testing.assert_allclose(rebuilt, first, atol=1e-6)
    _, quantized = _hidden(bert, tmp_path, quantize="int8")
    assert quantized.parent != path.parent
    manifest = json.loads((quantized.parent / cache.MANIFEST).read_text())
    assert manifest["meta"]["quantize"] == "int8"


def test_the_directorys_own_onnx_file_is_used_without_exporting(bert: Path, tmp_path: Path) -> None:
    import shutil

    from model_registry.backends.onnx import OnnxEngine

    exported, path = _hidden(bert, tmp_path / "first")
    own = tmp_path / "own"
    shutil.copytree(bert, own)
    (own / "onnx").mkdir()
    shutil.copyfile(path, own / "onnx" / "model.onnx")
    engine = OnnxEngine()
    engine.load(own, EngineOptions(device="cpu", cache_dir=str(tmp_path / "second")))
    assert engine.own
    assert engine.path == own / "onnx" / "model.onnx"
    assert not (tmp_path / "second" / "onnx").exists(), "the model was exported although it has its own file"
    ids = np.array([[2, 10, 11, 12, 3]], dtype=np.int64)
    np.testing.assert_allclose(engine.run(EncoderBatch(ids, np.ones_like(ids))).hidden, exported, atol=1e-6)
