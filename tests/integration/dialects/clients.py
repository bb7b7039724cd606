"""What the client-library tests share: the reference vectors and a guard that keeps every client
on this machine (a library that phones home at import or at its first call fails its test)."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from tests.conftest import LiveServer
from tests.integration.dialects.conftest import post


def openai_vectors(server: LiveServer, model: str, texts: list[str]) -> np.ndarray:
    """The OpenAI route's vectors over plain HTTP: what every client must get back."""
    data = post(server, "/v1/embeddings", {"model": model, "input": texts})["data"]
    return np.asarray([d["embedding"] for d in data], dtype=np.float64)


def _loopback(address: Any) -> bool:
    if not isinstance(address, tuple):  # a Unix socket
        return True
    try:
        return bool(ipaddress.ip_address(address[0]).is_loopback)
    except ValueError:
        return bool(address[0] == "localhost")


@contextmanager
def loopback_only() -> Iterator[list[Any]]:
    """Refuse every connection that leaves the machine, and record the attempts (a library that
    swallows the refusal in a background thread still shows up in the list)."""
    attempts: list[Any] = []
    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex

    def guarded(sock: socket.socket, address: Any) -> Any:
        if not _loopback(address):
            attempts.append(address)
            raise ConnectionRefusedError(f"the client tests reach 127.0.0.1 only, not {address}")
        return connect(sock, address)

    def guarded_ex(sock: socket.socket, address: Any) -> int:
        if not _loopback(address):
            attempts.append(address)
            return 111
        return connect_ex(sock, address)

    setattr(socket.socket, "connect", guarded)  # noqa: B010 (the stubs type the method more narrowly)
    setattr(socket.socket, "connect_ex", guarded_ex)  # noqa: B010
    try:
        yield attempts
    finally:
        setattr(socket.socket, "connect", connect)  # noqa: B010
        setattr(socket.socket, "connect_ex", connect_ex)  # noqa: B010
