"""Images and audio from URLs (guarded), data URIs and uploads, as `Media` for the engine.

A URL is fetched only over http(s), within a timeout, a byte limit and a redirect limit, and only
from a public address: the host is resolved here, every address it resolves to is checked, and
the connection goes to the checked address (with the original Host header and TLS server name),
so a DNS answer cannot change between the check and the connection. Every redirect is checked the
same way. Loopback, private, link-local, cloud-metadata, site-local, multicast and unspecified
addresses are refused unless the configuration allows private addresses or names the host in
`allowed_hosts`; an IPv6 address that embeds an IPv4 one is judged by what it embeds (`addresses.py`).

A server shares one `httpx.AsyncClient` for all its fetches (`shared_media_client`, closed by
`close_media_client` when the app stops): its TLS context and CA bundle are loaded once. Each
request still goes to an address checked for that request, and no connection is kept for reuse.

Before anything is decoded or fetched, the request's input count and URL count are checked. A
request fetches at most `concurrency` URLs at once, the server at most `server.media_max_fetches`,
and the fetched bytes held server-wide are bounded (`limits.py`). A compressed response is
counted as the bytes it decompresses to, as they stream, and stops at the byte limit.

Every failure is an `InvalidInput` naming the input's index: a 400 for the request, nothing more.
Its message names the URL as the client gave it (or a redirect's target), never an address the
server resolved a name to: the client must not learn the server's view of internal DNS.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import socket
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from infinity_server.fetch.addresses import Address, refused_reason
from infinity_server.fetch.limits import ACCEPTED_ENCODINGS, BoundedDecoder, FetchGate, Holding, TooLarge
from model_registry.errors import InvalidInput
from model_registry.types import Media, Modality

#: host, port -> the addresses it resolves to.
Resolver = Callable[[str, int], Awaitable[list[str]]]

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_INLINE_DECODE = 64 * 1024  # larger data URIs are decoded on a thread, off the event loop
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class FetchPolicy:
    """What a URL may point at and how much of it is read."""

    allow_private: bool = False
    allowed_hosts: frozenset[str] = frozenset()
    max_bytes: int = 16 * 2**20
    timeout: float = 10.0
    max_redirects: int = 3
    #: URLs (not data URIs) one request may name; checked before anything is fetched.
    max_urls: int = 64
    #: URLs of one request fetched at once.
    concurrency: int = 8
    #: Inputs one request may hold at all (the registry's `max_inputs_per_request`).
    max_inputs: int = 2048


def _bad(index: int, message: str) -> InvalidInput:
    return InvalidInput(f"input {index}: {message}", param="input")


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def parse_data_uri(value: str, index: int, modality: Modality, limit: int) -> tuple[str, bool]:
    """(payload, is_base64) of a `data:` URI whose media type fits `modality`."""
    header, comma, payload = value.partition(",")
    if not comma:
        raise _bad(index, "a data URI needs a ',' between its header and its data")
    params = header.removeprefix("data:").split(";")
    mediatype, is_base64 = params[0].strip().lower(), "base64" in (p.strip().lower() for p in params[1:])
    major = mediatype.partition("/")[0]
    document = modality == Modality.IMAGE and mediatype == "application/pdf"  # pages for a page model
    if mediatype and major != modality.value and mediatype != "application/octet-stream" and not document:
        raise _bad(index, f"the data URI holds '{mediatype}', not {modality.value} data")
    if (len(payload) * 3 // 4 if is_base64 else len(payload)) > limit + 3:
        raise _bad(index, f"the data URI holds more than the limit of {limit:,} bytes")
    return payload, is_base64


def decode_payload(payload: str, is_base64: bool, index: int, limit: int) -> bytes:
    try:
        data = base64.b64decode(payload, validate=True) if is_base64 else urllib.parse.unquote_to_bytes(payload)
    except (binascii.Error, ValueError) as error:
        raise _bad(index, f"the data URI's base64 is invalid ({error})") from None
    if not data:
        raise _bad(index, "the data URI holds no data")
    if len(data) > limit:
        raise _bad(index, f"the data URI holds {len(data):,} bytes, more than the limit of {limit:,}")
    return data


class MediaFetcher:
    """Turns URLs and data URIs into `Media`, within a `FetchPolicy` and the server's `FetchGate`."""

    def __init__(
        self,
        policy: FetchPolicy,
        *,
        gate: FetchGate | None = None,
        resolver: Resolver = system_resolver,
        transport: httpx.AsyncBaseTransport | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        """`client` is the server's shared one (`shared_media_client`); without it each call makes its own."""
        self.policy, self.resolver, self.transport, self.client = policy, resolver, transport, client
        self.gate = gate or FetchGate(max_fetches=policy.concurrency, max_bytes_in_flight=2**62)

    @asynccontextmanager
    async def loaded(self, values: Sequence[str], modality: Modality) -> AsyncIterator[list[Media]]:
        """The inputs as `Media`; the fetched bytes count against the server's budget until exit."""
        holding = Holding(self.gate)
        try:
            yield await self._load_all(values, modality, holding)
        finally:
            holding.release()

    async def load_all(self, values: Sequence[str], modality: Modality) -> list[Media]:
        async with self.loaded(values, modality) as media:
            return media

    def check_counts(self, values: Sequence[str]) -> None:
        """Refuse too many inputs or URLs before anything is decoded, resolved or fetched."""
        if len(values) > self.policy.max_inputs:
            raise InvalidInput(
                f"the request holds {len(values):,} inputs, more than the limit of {self.policy.max_inputs:,} "
                "(max_inputs_per_request); split it into smaller requests",
                param="input",
            )
        urls = sum(1 for v in values if isinstance(v, str) and not v.lstrip()[:5].lower().startswith("data:"))
        if urls > self.policy.max_urls:
            raise InvalidInput(
                f"the request names {urls:,} URLs, more than the limit of {self.policy.max_urls:,} per request "
                "(server.media_max_urls_per_request); send fewer URLs per request, or data URIs",
                param="input",
            )

    async def _load_all(self, values: Sequence[str], modality: Modality, holding: Holding) -> list[Media]:
        """At most `policy.concurrency` at once; the first failure (lowest index) is reported, the rest cancelled."""
        self.check_counts(values)
        if not values:  # nothing to fetch; the engine answers an empty input list
            return []
        own = asyncio.Semaphore(self.policy.concurrency)

        async def one(client: httpx.AsyncClient, index: int, value: str) -> Media:
            async with own:
                return await self.load(client, value, index, modality, holding)

        async with self._session() as client:
            tasks = [asyncio.ensure_future(one(client, i, v)) for i, v in enumerate(values)]
            try:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        failed = [t.exception() for t in tasks if t.done() and not t.cancelled() and t.exception() is not None]
        if failed:
            raise failed[0]  # type: ignore[misc]
        return [t.result() for t in tasks]

    async def load(
        self, client: httpx.AsyncClient, value: str, index: int, modality: Modality, holding: Holding
    ) -> Media:
        if not isinstance(value, str) or not value.strip():
            raise _bad(index, f"expected a URL or a data URI of {modality.value} data")
        value = value.strip()
        scheme = value.partition(":")[0].lower()
        if scheme == "data":
            payload, is_base64 = parse_data_uri(value, index, modality, self.policy.max_bytes)
            limit = self.policy.max_bytes
            if len(payload) > _INLINE_DECODE:
                data = await asyncio.to_thread(decode_payload, payload, is_base64, index, limit)
            else:
                data = decode_payload(payload, is_base64, index, limit)
            return Media(modality, data, source="data-uri")
        if scheme not in ("http", "https"):
            raise _bad(index, f"'{scheme}:' URLs are not fetched; use http(s) URLs or data URIs")
        async with self.gate.slots:
            try:
                fetching = self._fetch(client, value, index, holding)
                data = await asyncio.wait_for(fetching, self.policy.timeout)
            except asyncio.TimeoutError:
                raise _bad(index, f"fetching {value} took longer than {self.policy.timeout:g}s") from None
        return Media(modality, data, source=value)

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[httpx.AsyncClient]:
        """The shared client, left open; or one of this call's own, closed after it."""
        if self.client is not None:
            yield self.client
            return
        async with media_client(self.policy.timeout, self.transport) as client:
            yield client

    async def _fetch(self, client: httpx.AsyncClient, url: str, index: int, holding: Holding) -> bytes:
        current = httpx.URL(url)
        for _ in range(self.policy.max_redirects + 1):
            response = await self._send(client, current, index)
            try:
                if response.status_code in _REDIRECTS and "location" in response.headers:
                    current = current.join(response.headers["location"])
                    continue
                if response.status_code != 200:
                    raise _bad(index, f"fetching {current} answered HTTP {response.status_code}")
                return await self._read(response, current, index, holding)
            finally:
                await response.aclose()
        raise _bad(index, f"fetching {url} took more than {self.policy.max_redirects} redirects")

    async def _send(self, client: httpx.AsyncClient, url: httpx.URL, index: int) -> httpx.Response:
        """GET `url` from the first checked address of its host that accepts a connection."""
        if url.scheme not in ("http", "https"):
            raise _bad(index, f"'{url.scheme}:' URLs are not fetched (a redirect led to {url})")
        host = url.host
        if not host:
            raise _bad(index, f"the URL {url} has no host")
        port = url.port or (443 if url.scheme == "https" else 80)
        trusted = self.policy.allow_private or host.lower() in self.policy.allowed_hosts
        addresses = await self._addresses(host, port, index, trusted)
        headers = {"Host": url.netloc.decode("ascii"), "Accept": "*/*", "Accept-Encoding": ACCEPTED_ENCODINGS}
        extensions = {"sni_hostname": host} if url.scheme == "https" else {}
        failure: httpx.HTTPError | None = None
        for address in addresses:
            target = url.copy_with(host=address)
            request = client.build_request("GET", target, headers=headers, extensions=extensions)
            try:
                return await client.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as error:
                failure = error  # another address of the same host may answer
            except httpx.HTTPError as error:
                failure = error
                break
        raise _bad(index, f"fetching {url} failed: {type(failure).__name__} {_hide(str(failure), addresses, host)}")

    async def _addresses(self, host: str, port: int, index: int, trusted: bool) -> list[str]:
        """Every address `host` resolves to, all of them checked; one refused address refuses the host."""
        try:
            candidates: list[Address] = [ipaddress.ip_address(host)]
            resolved_here = False
        except ValueError:
            resolved_here = True
            try:
                resolved = await self.resolver(host, port)
            except OSError as error:
                raise _bad(index, f"the host '{host}' cannot be resolved ({error})") from None
            candidates = [ipaddress.ip_address(a.partition("%")[0]) for a in resolved]
        if not candidates:
            raise _bad(index, f"the host '{host}' resolves to no address")
        for address in candidates:
            # A literal's detail is the client's own input; a resolved name's addresses are not.
            reason = refused_reason(address, detail=not resolved_here)
            if reason is not None and not trusted:
                verb = "resolves to an address that is" if resolved_here else "is"
                raise _bad(
                    index,
                    f"the URL's host '{host}' {verb} {reason}; addresses that are not public are fetched only "
                    "when the server allows them (server.media_allow_private or server.media_allowed_hosts)",
                )
        return list(dict.fromkeys(str(a) for a in candidates))

    async def _read(self, response: httpx.Response, url: httpx.URL, index: int, holding: Holding) -> bytes:
        """The body, decompressed as it streams; both the wire bytes and the decompressed bytes are limited."""
        limit = self.policy.max_bytes
        declared = _length(response.headers.get("content-length", ""))
        if declared is not None and declared > limit:
            raise _bad(index, f"{url} is {declared:,} bytes, more than the limit of {limit:,}")
        decoder = BoundedDecoder(response.headers.get("content-encoding", ""), limit, index)
        chunks, wire = [], 0
        try:
            async for raw in response.aiter_raw(_CHUNK):
                wire += len(raw)
                if wire > limit:
                    raise TooLarge
                chunk = decoder.feed(raw)
                holding.take(len(chunk))
                chunks.append(chunk)
        except TooLarge:
            raise _bad(index, f"{url} is more than the limit of {limit:,} bytes (decompressed)") from None
        except ValueError as error:
            raise _bad(index, f"{url}: {error}") from None
        if not decoder.produced:
            raise _bad(index, f"{url} is empty")
        return b"".join(chunks)


def media_client(timeout: float, transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    """A client for media fetches: no proxy from the environment, no redirects of its own, and no
    kept connection, since a pooled TLS connection is keyed by address, not by the server name it
    was verified for, and would carry another name's request on the same address."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout),
        follow_redirects=False,
        transport=transport,
        trust_env=False,
        limits=httpx.Limits(max_keepalive_connections=0),
    )


def shared_media_client(state: Any, timeout: float) -> httpx.AsyncClient:
    """The app's one media client (on `state.media_client`), made on first use."""
    client: httpx.AsyncClient | None = getattr(state, "media_client", None)
    if client is None or client.is_closed:
        client = state.media_client = media_client(timeout)
    return client


async def close_media_client(state: Any) -> None:
    """Close the app's media client, if one was made; for the app's lifespan, when it stops."""
    client: httpx.AsyncClient | None = getattr(state, "media_client", None)
    state.media_client = None
    if client is not None:
        await client.aclose()


def _hide(message: str, addresses: Sequence[str], host: str) -> str:
    """`message` with each address the host resolved to written as the host's name."""
    for address in addresses:
        if address != host:
            message = message.replace(address, host)
    return message


def _length(declared: str) -> int | None:
    """A Content-Length header as a number (at most 10**18); None where it is none (then the
    body's own bytes are counted)."""
    if not (declared.isascii() and declared.isdigit()):
        return None
    return int(declared) if len(declared) <= 18 else 10**18
