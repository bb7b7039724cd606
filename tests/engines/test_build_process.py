"""Artifact builds run in a child process: their errors, deaths and stalls reach the caller as
clear errors, a stalled build is killed at the load's deadline or with its server, and the
server's process never runs the exporter itself."""

from __future__ import annotations

import contextvars
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from model_registry.backends import build_process, cache
from model_registry.backends.base import EngineOptions
from model_registry.backends.onnx import build as onnx_build
from model_registry.errors import ModelUnavailable
from tests.builders.text import tiny_bert
from tests.conftest import REPO

TARGETS = "tests.engines.build_targets"


@pytest.fixture(autouse=True)
def _child_imports_the_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))


def in_child(target: str, **arguments: Any) -> Callable[[Path], None]:
    def build(staging: Path) -> None:
        build_process.run(f"{TARGETS}:{target}", staging=str(staging), **arguments)

    return build


def failure(root: Path, target: str, **arguments: Any) -> str:
    with pytest.raises(ModelUnavailable) as failed:
        cache.cached(root, "onnx", "k1", in_child(target, **arguments))
    assert not [p for p in (root / "onnx").iterdir() if p.is_dir()], "a failed build left a directory"
    return str(failed.value)


def gone(pid: int, within: float) -> bool:
    """Whether process `pid` has ended (reaped, or a zombie) within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def started_pid(started: Path, within: float = 60) -> int:
    deadline = time.monotonic() + within
    while not started.exists() or not started.read_text():
        assert time.monotonic() < deadline, "the build never started"
        time.sleep(0.05)
    return int(started.read_text())


def test_a_build_runs_in_its_own_process_with_the_servers_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    artifact = cache.cached(tmp_path / "root", "onnx", "k1", in_child("writes"))
    facts = json.loads((artifact / "facts.json").read_text())
    assert facts["pid"] != os.getpid()
    assert facts["HF_HUB_OFFLINE"] == "1"
    assert "model_registry.registry" not in facts["imported"], "the child imported the whole registry"
    assert not [m for m in facts["imported"] if m.startswith("infinity_server")]
    assert cache.is_complete(artifact)


def test_an_error_in_the_build_reaches_the_caller_without_a_path(tmp_path: Path) -> None:
    message = failure(tmp_path / "root", "raises")
    assert message.startswith("building its onnx artifact failed: RuntimeError: cannot write <engine cache>/onnx/")
    assert str(tmp_path) not in message


def test_a_model_the_build_refuses_keeps_the_builds_own_message(tmp_path: Path) -> None:
    message = failure(tmp_path / "root", "unavailable")
    assert message == "its files lack what AutoModel needs: 1 weight(s) missing (classifier.weight)"


def test_a_build_killed_by_a_signal_says_so(tmp_path: Path) -> None:
    message = failure(tmp_path / "root", "killed")
    assert message == (
        "building its onnx artifact failed: its build process was killed by SIGKILL (the system may have run "
        "out of memory): loading the whole model into memory"
    )


def test_a_build_that_exits_says_its_status_and_last_line(tmp_path: Path) -> None:
    message = failure(tmp_path / "root", "exits")
    assert message == (
        "building its onnx artifact failed: its build process exited with status 3 without finishing: "
        "ImportError: libgomp.so.1: cannot open shared object file"
    )


def test_a_build_still_running_at_the_loads_deadline_is_killed(tmp_path: Path) -> None:
    started = tmp_path / "started"
    context = contextvars.copy_context()
    context.run(build_process.DEADLINE.set, time.monotonic() + 1.5)
    began = time.monotonic()
    with pytest.raises(ModelUnavailable, match="still running at the load's deadline"):
        context.run(cache.cached, tmp_path / "root", "onnx", "k1", in_child("stalls", started=str(started)))
    assert time.monotonic() - began < 30
    assert gone(started_pid(started), within=1), "the build's process outlived its deadline"


def test_a_build_ends_with_the_process_that_started_it(tmp_path: Path) -> None:
    started = tmp_path / "started"
    code = (
        "import sys; from model_registry.backends import build_process; "
        f"build_process.run('{TARGETS}:stalls', staging=sys.argv[1], started=sys.argv[2])"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    server = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(started)], env=env)
    try:
        child = started_pid(started)
    finally:
        server.kill()  # no cleanup runs, as when the server is killed
        server.wait(10)
    assert gone(child, within=10), "the build outlived the process that waited for it"


def test_a_load_past_its_timeout_kills_its_build_and_the_server_stays_up(
    serve: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = tmp_path / "started"

    def stalling(directory: Path, options: EngineOptions, fp16: bool, staging: Path) -> None:
        build_process.run(f"{TARGETS}:stalls", staging=str(staging), started=str(started))

    monkeypatch.setattr(onnx_build, "build_artifact", stalling)
    model = {"name": "mini", "source": str(tiny_bert(tmp_path / "bert")), "backend": "onnx", "device": "cpu"}
    live = serve({"models": [model], "engine_cache": str(tmp_path / "cache"), "load_timeout": 5})
    with live.client() as client:
        refused = client.post("/v1/embeddings", json={"model": "mini", "input": ["a"]})
        assert refused.status_code == 503, refused.text
        assert "loading took longer than 5s" in refused.json()["error"]["message"]
        assert gone(started_pid(started, within=1), within=2), "the build's process outlived the load"
        assert client.get("/health").status_code == 200


@pytest.mark.slow
def test_the_server_process_never_imports_the_exporter(tmp_path: Path) -> None:
    """A real export: the process asking for it imports neither torch nor the exporter."""
    directory = tiny_bert(tmp_path / "bert")
    code = (
        "import sys; from pathlib import Path; from model_registry.backends.onnx.engine import OnnxEngine; "
        "from model_registry.backends.base import EngineOptions; "
        "OnnxEngine().build(Path(sys.argv[1]), EngineOptions(device='cpu', cache_dir=sys.argv[2])); "
        "print(sorted(m for m in ('torch', 'onnxscript', 'transformers') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-c", code, str(directory), str(tmp_path / "cache")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert list((tmp_path / "cache" / "onnx").glob("*/model.onnx"))
