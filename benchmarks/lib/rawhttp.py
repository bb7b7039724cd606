"""A minimal HTTP/1.1 client on raw asyncio sockets, for floods.

httpx spends milliseconds of CPU per request in its pool; hundreds of concurrent requests from one
process then measure the client, not the server. This one sends pre-encoded bytes and reads one
response (Content-Length bodies only, which is what the server sends), one connection per request.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import orjson


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    seconds: float
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        return orjson.loads(self.body)


def encode(url: str, path: str, body: object | bytes, *, content_type: str = "application/json") -> bytes:
    """A complete POST request for `path` on `url`'s host (`body` as JSON unless already bytes)."""
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    host = urlsplit(url).netloc
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + data


async def send(url: str, request: bytes, timeout: float = 60.0) -> Answer:
    """Send pre-encoded `request` on a new connection; status 0 when no answer came in `timeout`."""
    parts = urlsplit(url)
    started = time.monotonic()
    try:
        return await asyncio.wait_for(_exchange(parts.hostname or "", parts.port or 80, request, started), timeout)
    except (asyncio.TimeoutError, OSError):
        return Answer(0, time.monotonic() - started, {}, b"")


async def _exchange(host: str, port: int, request: bytes, started: float) -> Answer:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        await writer.drain()
        status_line = await reader.readline()
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        return Answer(int(status_line.split()[1]), time.monotonic() - started, headers, body)
    finally:
        writer.close()
