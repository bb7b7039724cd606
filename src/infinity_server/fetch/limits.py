"""Server-wide bounds on fetched media: fetch slots, bytes held, and decompression that stops at a limit.

- `FetchGate` is one per server: at most `max_fetches` URLs are being fetched at once, and at most
  `max_bytes_in_flight` fetched bytes are held at once, from the first byte read until the request
  that fetched them is answered. A request that would pass the byte bound is refused with 429
  (`Overloaded`) instead of waiting, so a few large fetches cannot wedge the others; one whose own
  media pass the whole bound, which no wait would let in, with 400.
- `BoundedDecoder` undoes a `Content-Encoding` (gzip, deflate) chunk by chunk and stops as soon as
  the decompressed bytes pass the limit: a 10 KB response that inflates to 10 GB costs at most the
  limit plus one chunk, never the whole expansion.
"""

from __future__ import annotations

import asyncio
import zlib

from model_registry.errors import InvalidInput, Overloaded

#: Content-Encoding values that are undone here; anything else is refused, never passed to a decoder.
ACCEPTED_ENCODINGS = "gzip, deflate"


class FetchGate:
    """The server's fetch slots and its budget of fetched bytes held."""

    def __init__(self, max_fetches: int, max_bytes_in_flight: int) -> None:
        self.slots = asyncio.Semaphore(max_fetches)
        self.max_bytes_in_flight = max_bytes_in_flight
        self.held = 0

    def take(self, count: int) -> None:
        if self.held + count > self.max_bytes_in_flight:
            raise Overloaded(
                f"the server already holds {self.held:,} bytes of fetched media, near its limit of "
                f"{self.max_bytes_in_flight:,} (server.media_max_bytes_in_flight); retry shortly or send fewer URLs",
                retry_after=1.0,
            )
        self.held += count

    def give(self, count: int) -> None:
        self.held -= count


class Holding:
    """The fetched bytes one request holds against a `FetchGate`; `release` gives them all back."""

    def __init__(self, gate: FetchGate) -> None:
        self.gate, self.count = gate, 0

    def take(self, count: int) -> None:
        if self.count + count > self.gate.max_bytes_in_flight:  # no retry would ever fit it: not a 429
            raise InvalidInput(
                f"this request's media pass {self.count + count:,} bytes, more than the server holds for all "
                f"requests at once ({self.gate.max_bytes_in_flight:,}, server.media_max_bytes_in_flight); "
                "send fewer or smaller media per request",
                param="input",
            )
        self.gate.take(count)
        self.count += count

    def release(self) -> None:
        self.gate.give(self.count)
        self.count = 0


class TooLarge(Exception):
    """The decompressed body passed the limit."""


class BoundedDecoder:
    """Decompress a response body piece by piece, never producing more than `limit` + 1 bytes."""

    def __init__(self, encoding: str, limit: int, index: int) -> None:
        name = encoding.strip().lower()
        self.limit, self.produced = limit, 0
        self.inflater: zlib._Decompress | None = None
        if name in ("gzip", "x-gzip"):
            self.inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif name == "deflate":
            self.inflater = zlib.decompressobj(zlib.MAX_WBITS)
        elif name not in ("", "identity"):
            raise InvalidInput(
                f"input {index}: the response's Content-Encoding '{encoding}' is not accepted "
                f"(accepted: {ACCEPTED_ENCODINGS}, or none)",
                param="input",
            )
        self.raw_deflate = name == "deflate"

    def feed(self, data: bytes) -> bytes:
        if self.inflater is None:
            return self._count(data)
        pieces = []
        try:
            while data and not self.inflater.eof:
                # max_length bounds the output of this one call; 0 would mean unbounded, so never pass 0.
                piece = self.inflater.decompress(data, self.limit - self.produced + 1)
                pieces.append(self._count(piece))
                data = self.inflater.unconsumed_tail
        except zlib.error as error:
            if self.raw_deflate and self.produced == 0:
                # Some servers send raw deflate (no zlib header) as `deflate`: retry once without it.
                self.inflater, self.raw_deflate = zlib.decompressobj(-zlib.MAX_WBITS), False
                return self.feed(data)
            raise ValueError(f"the compressed response is corrupt ({error})") from None
        return b"".join(pieces)

    def _count(self, piece: bytes) -> bytes:
        self.produced += len(piece)
        if self.produced > self.limit:
            raise TooLarge
        return piece
