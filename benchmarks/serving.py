"""The server as a benchmark's subprocess: a free loopback port, a configuration file, ready."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(
    config: dict[str, Any], workdir: Path, port: int, *, timeout: float = 300, cpus: set[int] | None = None
) -> subprocess.Popen[bytes]:
    """`infinity-server serve` from this checkout on 127.0.0.1:`port`, once `/ready` answers 200.

    `config` is the YAML file's content (written as JSON, which YAML reads); with no `models` the
    server serves its bundled default model. `cpus` pins the process to those cores (as a pod's CPU
    limit would; the torch backend sizes its threads from the affinity).
    """
    server = {"host": "127.0.0.1", "port": port, "log_level": "warning", **config.get("server", {})}
    path = workdir / "config.yaml"
    path.write_text(json.dumps({**config, "server": server}))
    python_path = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": python_path, "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "infinity_server.cli", "serve", "--config", str(path)]
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    log = workdir / "server.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=sink, preexec_fn=pin)
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if client.get("/ready").status_code == 200:
                    return process
            except httpx.TransportError:
                pass
            time.sleep(0.3)
    process.kill()
    process.wait()
    tail = log.read_text(errors="replace")[-2000:]
    raise RuntimeError(f"the server did not become ready; the end of its log:\n{tail}")
