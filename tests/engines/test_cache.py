"""The engine artifact cache: built once, rebuilt when corrupt, keyed by options, safe across
processes, and never a crash loop on a read-only directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_registry.backends import cache
from model_registry.backends.base import EncoderBatch, EngineOptions
from model_registry.errors import ModelUnavailable
from tests.builders.text import tiny_bert
from tests.conftest import REPO
from tests.waiting import eventually

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
    from model_registry.backends.onnx.engine import OnnxEngine

    engine = OnnxEngine()
    engine.load(directory, EngineOptions(device="cpu", quantize=quantize, cache_dir=str(root)))
    ids = np.array([[2, 10, 11, 12, 3]], dtype=np.int64)
    hidden = engine.run(EncoderBatch(ids, np.ones_like(ids))).hidden
    assert engine.path is not None
    path = engine.path
    engine.release()
    return hidden, path


def _plant_graph(path: Path) -> None:
    """A graph with the export's inputs and output that answers the token ids as the hidden state."""
    import onnx
    from onnx import TensorProto, helper

    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"])
    out = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "tokens", 1])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [2])
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids_float"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["ids_float", "axes"], ["last_hidden_state"]),
    ]
    graph = helper.make_graph(nodes, "planted", [ids, mask], [out], initializer=[axes])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_onnx_export_is_cached_rebuilt_when_corrupt_and_keyed_by_options(bert: Path, tmp_path: Path) -> None:
    first, path = _hidden(bert, tmp_path)
    built = path.stat().st_mtime_ns
    again, same = _hidden(bert, tmp_path)
    assert same == path
    assert path.stat().st_mtime_ns == built, "the second load exported again"
    np.testing.assert_array_equal(first, again)
    _plant_graph(path)  # a valid graph of someone else's, in place of the export
    rebuilt, _ = _hidden(bert, tmp_path)
    np.testing.assert_allclose(rebuilt, first, atol=1e-6)
    _, quantized = _hidden(bert, tmp_path, quantize="int8")
    assert quantized.parent != path.parent
    manifest = json.loads((quantized.parent / cache.MANIFEST).read_text())
    assert manifest["meta"]["quantize"] == "int8"


def test_the_directorys_own_onnx_file_is_used_without_exporting(bert: Path, tmp_path: Path) -> None:
    import shutil

    from model_registry.backends.onnx.engine import OnnxEngine

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


# ---- trust: only what the server's user alone could write is run ------------------------------

OTHER_UID = 54321


def _refused(root: Path, log: Path) -> str:
    with pytest.raises(cache.UnsafeCache) as refused:
        cache.cached(root, "onnx", "k1", counting_build(log))
    message = str(refused.value)
    assert "registry.engine_cache" in message
    assert str(root.parent) not in message, "the message names a path on the server"
    assert not log.exists(), "something was built or run from an unsafe cache"
    return message


@pytest.mark.parametrize("where", ["root", "engine"])
def test_a_cache_directory_others_can_write_is_refused(tmp_path: Path, where: str) -> None:
    root = tmp_path / "root"
    (root / "onnx").mkdir(parents=True)
    (root if where == "root" else root / "onnx").chmod(0o777)
    assert "can be written by other users (mode 777)" in _refused(root, tmp_path / BUILDS)


def test_a_cache_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    root = tmp_path / "root"
    root.mkdir()
    os.chown(root, OTHER_UID, -1)
    assert f"belongs to another user (uid {OTHER_UID})" in _refused(root, tmp_path / BUILDS)


def test_a_directory_above_the_cache_is_trusted_only_when_sticky(tmp_path: Path) -> None:
    above = tmp_path / "shared"
    above.mkdir()
    above.chmod(0o777)  # anyone could rename the cache away and put their own in its place
    assert "a directory above the cache can be written" in _refused(above / "root", tmp_path / BUILDS)
    above.chmod(0o1777)  # as /tmp: others cannot rename or remove what is not theirs
    assert cache.cached(above / "root", "onnx", "k1", counting_build(tmp_path / BUILDS)).is_dir()


def test_an_artifact_another_user_could_have_written_is_never_loaded(tmp_path: Path) -> None:
    log = tmp_path / BUILDS
    artifact = cache.cached(tmp_path / "root", "onnx", "k1", counting_build(log))
    (artifact / "weights.bin").chmod(0o666)
    with pytest.raises(cache.UnsafeCache, match=r"file weights\.bin can be written by other users"):
        cache.cached(tmp_path / "root", "onnx", "k1", counting_build(log))
    (artifact / "weights.bin").chmod(0o644)
    if os.geteuid() == 0:
        os.chown(artifact, OTHER_UID, -1)
        with pytest.raises(cache.UnsafeCache, match=rf"directory belongs to another user \(uid {OTHER_UID}\)"):
            cache.cached(tmp_path / "root", "onnx", "k1", counting_build(log))
    assert log.read_text().count("\n") == 1


def test_a_file_the_manifest_does_not_list_gets_the_artifact_rebuilt(tmp_path: Path) -> None:
    log = tmp_path / BUILDS
    artifact = cache.cached(tmp_path / "root", "onnx", "k1", counting_build(log))
    (artifact / "model.onnx_data").write_bytes(b"planted")
    rebuilt = cache.cached(tmp_path / "root", "onnx", "k1", counting_build(log))
    assert not (rebuilt / "model.onnx_data").exists()
    assert log.read_text().count("\n") == 2


def test_built_files_are_closed_to_other_users_whatever_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0)
    try:
        artifact = cache.cached(tmp_path / "root", "onnx", "k1", counting_build(tmp_path / BUILDS))
    finally:
        os.umask(previous)
    assert (artifact / "weights.bin").stat().st_mode & 0o022 == 0
    assert cache.cached(tmp_path / "root", "onnx", "k1", counting_build(tmp_path / BUILDS)) == artifact


def test_a_failed_build_names_no_path_of_the_cache(tmp_path: Path) -> None:
    def failing(staging: Path) -> None:
        raise RuntimeError(f"cannot write {staging / 'model.onnx'}")

    with pytest.raises(ModelUnavailable, match="building its onnx artifact failed: RuntimeError") as failed:
        cache.cached(tmp_path / "root", "onnx", "k1", failing)
    assert str(tmp_path) not in str(failed.value)
    assert cache.HIDDEN in str(failed.value)


# ---- staging directories left by builds that died ----------------------------------------------


def test_staging_left_by_a_killed_build_is_removed(tmp_path: Path) -> None:
    root, started = tmp_path / "root", tmp_path / "started"
    code = (
        "import sys, time; from pathlib import Path; from model_registry.backends.cache import cached; "
        "cached(Path(sys.argv[1]), 'onnx', 'k2', lambda s: (Path(sys.argv[2]).write_text(str(s)), time.sleep(60)))"
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}
    building = subprocess.Popen([sys.executable, "-c", code, str(root), str(started)], cwd=REPO, env=env)
    try:
        # The file exists a moment before the path is written into it: wait for the path.
        written = eventually(lambda: started.read_text() if started.exists() else "", deadline=30)
    finally:
        building.kill()  # as an out-of-memory kill would: no cleanup runs
        building.wait(10)
    staging = Path(written)
    assert staging.is_dir()
    cache.cached(root, "onnx", "k1", counting_build(tmp_path / BUILDS))  # any later use of the cache
    assert not staging.exists()


def test_the_staging_of_a_build_still_running_is_kept(tmp_path: Path) -> None:
    root, release, seen = tmp_path / "root", threading.Event(), []

    def slow(staging: Path) -> None:
        seen.append(staging)
        release.wait(30)
        (staging / "weights.bin").write_bytes(b"z")

    building = threading.Thread(target=cache.cached, args=(root, "onnx", "k2", slow))
    building.start()
    try:
        eventually(lambda: seen)
        cache.cached(root, "onnx", "k1", counting_build(tmp_path / BUILDS))
        assert seen[0].is_dir(), "the staging directory of a running build was removed"
    finally:
        release.set()
        building.join(30)
    assert (root / "onnx" / "k2" / "weights.bin").read_bytes() == b"z"


def test_an_unsafe_cache_fails_the_load_over_http_without_naming_a_path(serve: Any, tmp_path: Path) -> None:
    shared = tmp_path / "shared-cache"
    shared.mkdir()
    shared.chmod(0o777)
    model = {"name": "mini", "source": str(tiny_bert(tmp_path / "bert")), "backend": "onnx", "device": "cpu"}
    server = serve({"models": [model], "engine_cache": str(shared)})
    with server.client() as client:
        refused = client.post("/v1/embeddings", json={"model": "mini", "input": ["a"]})
        assert refused.status_code == 503
        message = refused.json()["error"]["message"]
        entry = {m["id"]: m for m in client.get("/v1/models").json()["data"]}["mini"]
        assert client.get("/health").status_code == 200
    assert "the model 'mini' failed to load" in message
    assert "can be written by other users" in message
    assert "registry.engine_cache" in message
    assert entry["status"] == "failed"
    assert "can be written by other users" in entry["error"]
    for shown in (message, entry["error"]):
        assert str(tmp_path) not in shown, shown
    assert not (shared / "onnx").exists() or not any((shared / "onnx").iterdir()), "something was exported"
