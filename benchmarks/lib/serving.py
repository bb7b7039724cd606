"""The server as a benchmark's subprocess: a free loopback port, a configuration file, ready; and a
bare keep-alive client for latency probes."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]


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


_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)


class Reply:
    """One response: the seconds from the request's first byte sent to the response's last byte
    read, and its status, headers (lower-cased names) and body, parsed after the clock stopped."""

    def __init__(self, seconds: float, head: bytes, body: bytes) -> None:
        self.seconds = seconds
        status_line, *lines = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split(" ", 2)[1])
        self.headers: dict[str, str] = {}
        for line in lines:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        self.body = body


class KeepAlive:
    """A bare HTTP/1.1 client on one keep-alive connection, for latency probes.

    Like `wrk` or `curl -w time_total`, it times the server: the request is sent as one write and
    the clock stops at the response's last byte; parsing happens after that. The standard
    library's `http.client` parses each response's headers with the `email` package on the way:
    0.25-0.45 ms of the client's own per request on a 2-core host, inside its figure. Responses
    must carry a Content-Length (the server's always do: no chunked bodies).
    """

    def __init__(self, host: str, port: int, timeout: float = 60) -> None:
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._host = f"{host}:{port}".encode()

    def request(self, method: str, path: str, body: bytes = b"", content_type: str = "application/json") -> Reply:
        head = b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n" % (
            method.encode(),
            path.encode(),
            self._host,
            len(body),
        )
        if body:
            head += b"Content-Type: %s\r\n" % content_type.encode()
        message = head + b"\r\n" + body
        started = time.perf_counter()
        self._sock.sendall(message)
        received = b""
        while (end := received.find(b"\r\n\r\n")) < 0:
            received += self._read()
        length = _CONTENT_LENGTH.search(received, 0, end + 2)
        if length is None:
            raise RuntimeError(f"a response without a Content-Length: {received[:end]!r}")
        size = end + 4 + int(length.group(1))
        while len(received) < size:
            received += self._read()
        seconds = time.perf_counter() - started
        if len(received) > size:
            raise RuntimeError("the server sent more than one response")
        return Reply(seconds, received[:end], received[end + 4 : size])

    def _read(self) -> bytes:
        chunk = self._sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        return chunk

    def close(self) -> None:
        self._sock.close()
