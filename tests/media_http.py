"""A loopback HTTP server for media tests: files from a directory, redirects, a slow and a huge route.

`GET /<name>` serves the file; `GET /redirect?to=<url>` answers 302 to `url`;
`GET /big` streams more bytes than any test limit; `GET /slow/<name>` serves the file after a second;
`GET /gzip-bomb` answers 64 KiB of gzip (`Content-Encoding: gzip`) that inflate to 64 MiB of zeros.
"""

from __future__ import annotations

import functools
import gzip
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_TYPES = {".jpg": "image/jpeg", ".png": "image/png", ".wav": "audio/wav"}


@functools.cache
def gzip_bomb() -> bytes:
    return gzip.compress(bytes(64 * 2**20), compresslevel=9)


def _handler(directory: Path, hits: list[str]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            hits.append(self.path)
            parsed = urllib.parse.urlparse(self.path)
            if parsed.path == "/redirect":
                target = urllib.parse.parse_qs(parsed.query)["to"][0]
                self.send_response(302)
                self.send_header("Location", target)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if parsed.path == "/gzip-bomb":
                bomb = gzip_bomb()
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(bomb)))
                self.end_headers()
                self.wfile.write(bomb)
                return
            if parsed.path == "/big":
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.end_headers()
                for _ in range(64):
                    self.wfile.write(b"\0" * 65536)
                return
            name = parsed.path.lstrip("/")
            if name.startswith("slow/"):
                time.sleep(1.0)
                name = name.removeprefix("slow/")
            path = directory / name
            if not path.is_file():
                self.send_error(404)
                return
            data = path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", _TYPES.get(path.suffix, "application/octet-stream"))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@contextmanager
def file_server(directory: Path) -> Iterator[tuple[str, list[str]]]:
    """(base URL on 127.0.0.1, the list of paths requested so far)."""
    hits: list[str] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(directory, hits))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
