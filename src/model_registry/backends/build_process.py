"""Building an engine artifact (an ONNX export, a CTranslate2 conversion) in a child process.

A build loads the whole torch model and holds the interpreter lock for seconds at a time: on the
server's threads it keeps `/health` waiting up to a second on two cores, and a crash or a memory
spike in the exporter takes the server with it. `run` starts a fresh interpreter that imports only the
build's modules, hands it the build's arguments and waits for it:

- an error in the build reaches the caller: a `ModelUnavailable` as it was raised, any other error
  as `BuildFailed` with its type and message; a child that dies (killed by a signal, the
  out-of-memory killer's SIGKILL among them, or an exit without an answer) is a `BuildFailed`
  naming the signal or the status and the last line it wrote;
- a build still running at `DEADLINE` (the load's deadline, set by the lifecycle) is killed, and so
  is one whose server exits: the child reads its standard input until the end of the file, which
  comes when the server closes the pipe or dies;
- the environment passes through (HF_HUB_OFFLINE and the like); what the child logs goes to the
  server's log under the same logger names, and whatever it prints goes there too.
"""

from __future__ import annotations

import contextvars
import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO, Any

from model_registry.errors import ModelUnavailable

log = logging.getLogger(__name__)

#: When the load that asked for the build gives up (`time.monotonic()`), or None for no limit.
DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("build_deadline", default=None)
#: The `model_registry` package's directory, for the child's imports.
_PACKAGE = Path(__file__).resolve().parents[1]
# The package's own __init__ imports the whole registry (0.5 s more at each start, measured); a
# build needs only its engine's modules, so the child gets the package without it.
_BOOT = (
    "import sys, types; package = types.ModuleType('model_registry'); package.__path__ = [sys.argv[1]]; "
    "sys.modules['model_registry'] = package; from model_registry.backends.build_process import main; main()"
)
_LONGEST = 2000


class BuildFailed(Exception):
    """A build in the child failed; the message says how, without a traceback."""


def run(target: str, **arguments: Any) -> None:
    """Call `target` ('module:function') with `arguments` (JSON values) in a child process and
    wait for it; raises `ModelUnavailable` or `BuildFailed` when it fails, dies or outlives the
    load's deadline."""
    deadline = DEADLINE.get()
    if deadline is not None and deadline <= time.monotonic():
        raise BuildFailed("the load's deadline passed before the build could start")
    request = {"target": target, "arguments": arguments, "log_level": logging.getLogger().getEffectiveLevel()}
    child = subprocess.Popen(
        [sys.executable, "-c", _BOOT, str(_PACKAGE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    log.info("building with %s in process %d", target, child.pid)
    tail: deque[str] = deque(maxlen=1)
    forwarding = threading.Thread(target=_forward, args=(child.stderr, tail), name="build-log", daemon=True)
    forwarding.start()
    try:
        _send(child, request)
        _wait(child, deadline)
    finally:
        answer = _close(child, forwarding)
    _outcome(child.returncode, answer, tail[0] if tail else "")


def _close(child: subprocess.Popen[bytes], forwarding: threading.Thread) -> bytes:
    """The child's answer, once it has ended: killed here if its wait was abandoned."""
    if child.poll() is None:
        child.kill()
        child.wait()
    forwarding.join(5)
    assert child.stdin is not None
    assert child.stdout is not None
    answer = child.stdout.read()
    child.stdin.close()
    child.stdout.close()
    return answer


def _send(child: subprocess.Popen[bytes], request: dict[str, Any]) -> None:
    assert child.stdin is not None
    try:
        child.stdin.write(json.dumps(request).encode() + b"\n")
        child.stdin.flush()
    except BrokenPipeError:
        pass  # the child died at start: its status and last line say why


def _wait(child: subprocess.Popen[bytes], deadline: float | None) -> None:
    try:
        child.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        log.warning("stopped the build in process %d at the load's deadline", child.pid)
        raise BuildFailed("it was still running at the load's deadline (load_timeout); it was stopped") from None


def _outcome(status: int, answer: bytes, last_line: str) -> None:
    try:
        result = json.loads(answer) if answer.strip() else {}
    except ValueError:
        result = {}
    if "unavailable" in result:
        raise ModelUnavailable(str(result["unavailable"]))
    if "failed" in result:
        raise BuildFailed(str(result["failed"]))
    if result.get("ok") and status == 0:
        return
    said = f": {last_line}" if last_line else ""
    if status < 0:
        name = signal.Signals(-status).name if -status in signal.valid_signals() else f"signal {-status}"
        cause = " (the system may have run out of memory)" if -status == signal.SIGKILL else ""
        raise BuildFailed(f"its build process was killed by {name}{cause}{said}")
    raise BuildFailed(f"its build process exited with status {status} without finishing{said}")


def _forward(stream: IO[bytes] | None, tail: deque[str]) -> None:
    """The child's log records, one JSON object a line, into this process's log; anything else
    it writes (progress bars, prints) at INFO. Keeps the last line for an error message."""
    assert stream is not None
    for raw in stream:
        line = raw.decode("utf-8", "replace").rstrip()
        if not line:
            continue
        try:
            record = json.loads(line)
            logging.getLogger(record["logger"]).log(int(record["level"]), "%s", record["message"])
            last = str(record["message"]).rstrip().rpartition("\n")[2]
        except (ValueError, KeyError, TypeError):
            log.info("build: %s", line)
            last = line.rpartition("\r")[2]
        if last.strip():
            tail.append(last.strip()[:_LONGEST])
    stream.close()


# ---- the child ----------------------------------------------------------------------------------


class _Lines(logging.Formatter):
    """One JSON object a record, traceback included, so the parent can split them."""

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        return json.dumps({"level": record.levelno, "logger": record.name, "message": message})


def _exit_with_parent() -> None:
    # Unbuffered: a thread blocked in a buffered read at exit makes the interpreter abort.
    while os.read(0, 4096):  # empty at the end of the file: the server closed the pipe or died
        pass
    os._exit(70)


def main() -> None:
    """The child's entry: read the request, run the build, answer on the original stdout."""
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # what the build prints goes to the log, never into the answer
    request = json.loads(sys.stdin.buffer.readline())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Lines())
    logging.basicConfig(level=request["log_level"], handlers=[handler], force=True)
    threading.Thread(target=_exit_with_parent, name="parent-watch", daemon=True).start()
    answer: dict[str, Any] = {"ok": True}
    try:
        module, _, name = str(request["target"]).partition(":")
        getattr(importlib.import_module(module), name)(**request["arguments"])
    except ModelUnavailable as error:
        answer = {"unavailable": str(error)[:_LONGEST]}
    except Exception as error:
        log.exception("the build failed")
        answer = {"failed": f"{type(error).__name__}: {error}"[:_LONGEST]}
    answers.write(json.dumps(answer))
    answers.close()
