"""Builds that `build_process.run` runs in its child process: each one fails, dies or stalls in its
own way. Imported by the child only, with the standard library and the engine's errors."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from model_registry.errors import ModelUnavailable


def writes(staging: str) -> None:
    """What the child is: its process, the environment it got and the modules it imported."""
    facts = {
        "pid": os.getpid(),
        "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE"),
        "imported": sorted(m for m in sys.modules if m.startswith(("model_registry", "infinity_server"))),
    }
    (Path(staging) / "facts.json").write_text(json.dumps(facts))
    print("a line an exporter prints to stdout")  # must not spoil the answer


def raises(staging: str) -> None:
    raise RuntimeError(f"cannot write {Path(staging) / 'model.onnx'}")


def unavailable(staging: str) -> None:
    raise ModelUnavailable("its files lack what AutoModel needs: 1 weight(s) missing (classifier.weight)")


def killed(staging: str) -> None:
    print("loading the whole model into memory", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer does


def exits(staging: str) -> None:
    print("ImportError: libgomp.so.1: cannot open shared object file", file=sys.stderr, flush=True)
    os._exit(3)


def stalls(staging: str, started: str) -> None:
    """Writes its process id to `started`, then runs for far longer than any test waits."""
    Path(started).write_text(str(os.getpid()))
    time.sleep(120)
