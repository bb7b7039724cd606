"""The URL guard, on a recording transport: refused addresses are never connected to."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from infinity_server.fetch.addresses import embedded_ipv4, refused_reason
from infinity_server.fetch.client import (
    FetchPolicy,
    MediaFetcher,
    close_media_client,
    media_client,
    shared_media_client,
)
from model_registry.errors import InvalidInput
from model_registry.types import Media, Modality

PUBLIC = "93.184.215.14"


class Replay(httpx.AsyncByteStream):
    """The raw (still encoded) bytes of a table's response, streamed as a network answer would be."""

    def __init__(self, source: httpx.Response) -> None:
        self.source = source

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.source.stream:  # type: ignore[union-attr]
            yield chunk


class Recorder:
    """A transport that answers from a table and records every request that reached it."""

    def __init__(self, routes: dict[str, httpx.Response]) -> None:
        self.routes, self.seen = routes, []  # type: ignore[var-annotated]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        key = f"{request.url.host}{request.url.path}"
        table = self.routes.get(key, httpx.Response(404))
        return httpx.Response(table.status_code, headers=table.headers, stream=Replay(table))


def fetcher(recorder: Recorder, names: dict[str, list[str]] | None = None, **policy: object) -> MediaFetcher:
    table = {"photos.example": [PUBLIC], "localhost": ["127.0.0.1", "::1"], "sneaky.example": ["10.1.2.3"]}
    table.update(names or {})

    async def resolver(host: str, port: int) -> list[str]:
        if host not in table:
            raise OSError("name not known")
        return table[host]

    return MediaFetcher(FetchPolicy(**policy), resolver=resolver, transport=httpx.MockTransport(recorder))  # type: ignore[arg-type]


def fetch(f: MediaFetcher, *urls: str) -> list[Media]:
    return asyncio.run(f.load_all(list(urls), Modality.IMAGE))


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.0.0.1", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("::ffff:127.0.0.1", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("100.64.0.1", "non-public"),
        (PUBLIC, None),
        # Every IPv6 form that embeds IPv4 is judged by what it embeds.
        ("::ffff:10.0.0.1", "private"),
        ("::127.0.0.1", "loopback"),
        ("::169.254.169.254", "link-local"),
        ("64:ff9b::7f00:1", "loopback"),
        ("64:ff9b::a9fe:a9fe", "link-local"),
        ("64:ff9b:1::7f00:1", "loopback"),
        ("64:ff9b:1::5db8:d70e", "non-public"),
        ("2002:7f00:1::", "loopback"),
        ("2002:a00:1::", "private"),
        ("2002:a9fe:a9fe::1", "link-local"),
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback"),  # Teredo client 127.0.0.1 (obfuscated)
        ("2001:0:a00:1::", "private"),  # Teredo server 10.0.0.1
        ("2001:0:5db8:d70e:8000:0:a2ff:fff1", "private"),  # public server, client 93.0.0.14: Teredo is never public
        ("::ffff:93.184.215.14", None),
        ("64:ff9b::5db8:d70e", None),
        ("2002:5db8:d70e::1", None),
        ("fec0::1", "site-local"),  # deprecated, still routed inside some networks
        ("2600:1f18::5efe:a9fe:a9fe", "link-local"),  # ISATAP for 169.254.169.254
        ("2600:1f18::200:5efe:a9fe:a9fe", "link-local"),  # ISATAP, universal bit set
        ("2600:1f18::5efe:a00:1", "private"),
        ("fd00::200:5efe:5db8:d70e", "private"),  # a public IPv4 behind a private prefix
        ("2002:5db8:d70e:0:0:5efe:7f00:1", "loopback"),  # 6to4 prefix, ISATAP identifier
        ("2600:1f18::200:5efe:5db8:d70e", None),
    ],
)
def test_refused_reason(address: str, reason: str | None) -> None:
    found = refused_reason(ipaddress.ip_address(address))
    assert (found is None) if reason is None else (found is not None and found.startswith(reason))


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/a.png",
        "http://[::1]/a.png",
        "http://10.0.0.1/a.png",
        "http://169.254.169.254/latest/meta-data/",
        "http://localhost/a.png",
        "http://sneaky.example/a.png",
        "https://[::ffff:127.0.0.1]/a.png",
        "http://[2002:7f00:1::]/a.png",
        "http://[64:ff9b::7f00:1]/a.png",
        "http://[64:ff9b:1::a00:1]/a.png",
        "http://[::7f00:1]/a.png",
        "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/a.png",
        "http://[fec0::1]/a.png",
        "http://[2600:1f18::5efe:a9fe:a9fe]/latest/meta-data/",
        "http://[2600:1f18::200:5efe:a9fe:a9fe]/latest/meta-data/",
    ],
)
def test_private_targets_are_refused_before_connecting(url: str) -> None:
    recorder = Recorder({})
    with pytest.raises(InvalidInput, match=r"input 0: the URL's host .* addresses that are not public"):
        fetch(fetcher(recorder), url)
    assert recorder.seen == []


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://photos.example/a.png", "gopher://x/"])
def test_other_schemes_are_refused(url: str) -> None:
    recorder = Recorder({})
    with pytest.raises(InvalidInput, match="URLs are not fetched"):
        fetch(fetcher(recorder), url)
    assert recorder.seen == []


def test_public_host_is_fetched_at_the_checked_address() -> None:
    recorder = Recorder({f"{PUBLIC}/a.png": httpx.Response(200, content=b"png!")})
    (media,) = fetch(fetcher(recorder), "http://photos.example/a.png")
    assert media.data == b"png!"
    assert media.source == "http://photos.example/a.png"
    (request,) = recorder.seen
    assert request.url.host == PUBLIC
    assert request.headers["host"] == "photos.example"


def test_https_keeps_the_server_name_for_tls() -> None:
    recorder = Recorder({f"{PUBLIC}/a.png": httpx.Response(200, content=b"png!")})
    fetch(fetcher(recorder), "https://photos.example/a.png")
    assert recorder.seen[0].extensions["sni_hostname"] == "photos.example"


@pytest.mark.parametrize(
    "target", ["http://10.0.0.1/x", "http://localhost/x", "http://169.254.169.254/", "file:///etc/passwd"]
)
def test_every_redirect_is_checked(target: str) -> None:
    recorder = Recorder({f"{PUBLIC}/r": httpx.Response(302, headers={"location": target})})
    with pytest.raises(InvalidInput, match="input 0"):
        fetch(fetcher(recorder), "http://photos.example/r")
    assert [r.url.host for r in recorder.seen] == [PUBLIC]


def test_redirect_limit() -> None:
    recorder = Recorder({f"{PUBLIC}/loop": httpx.Response(302, headers={"location": "/loop"})})
    with pytest.raises(InvalidInput, match="more than 2 redirects"):
        fetch(fetcher(recorder, max_redirects=2), "http://photos.example/loop")
    assert len(recorder.seen) == 3


async def chunks() -> AsyncIterator[bytes]:
    for _ in range(2):
        yield b"x" * 600


def test_byte_limit_by_header_and_by_counting() -> None:
    recorder = Recorder(
        {
            f"{PUBLIC}/declared": httpx.Response(200, content=b"x" * 2000),
            f"{PUBLIC}/streamed": httpx.Response(200, content=chunks()),
        }
    )
    f = fetcher(recorder, max_bytes=1000)
    with pytest.raises(InvalidInput, match="2,000 bytes, more than the limit of 1,000"):
        fetch(f, "http://photos.example/declared")
    with pytest.raises(InvalidInput, match="more than the limit of 1,000 bytes"):
        fetch(f, "http://photos.example/streamed")


def test_allowed_hosts_and_allow_private() -> None:
    recorder = Recorder({"127.0.0.1/a.png": httpx.Response(200, content=b"ok")})
    assert fetch(fetcher(recorder, allowed_hosts=frozenset({"127.0.0.1"})), "http://127.0.0.1/a.png")[0].data == b"ok"
    # Allowing the address by name does not allow other names that resolve to it.
    with pytest.raises(InvalidInput, match="loopback"):
        fetch(fetcher(recorder, allowed_hosts=frozenset({"127.0.0.1"})), "http://localhost/a.png")
    assert fetch(fetcher(recorder, allow_private=True), "http://localhost/a.png")[0].data == b"ok"


def test_http_error_and_unknown_host_name_the_index() -> None:
    f = fetcher(Recorder({}))
    with pytest.raises(InvalidInput, match=r"input 0: fetching http://photos\.example/missing answered HTTP 404"):
        fetch(f, "http://photos.example/missing")
    with pytest.raises(InvalidInput, match=r"input 0: the host 'nowhere\.example' cannot be resolved"):
        fetch(f, "http://nowhere.example/a.png")


def test_data_uris() -> None:
    f = fetcher(Recorder({}), max_bytes=100)
    payload = base64.b64encode(b"\x89PNG....").decode()
    (media,) = fetch(f, f"data:image/png;base64,{payload}")
    assert media.data == b"\x89PNG...."
    assert fetch(f, "data:,hello%20world")[0].data == b"hello world"
    with pytest.raises(InvalidInput, match="holds 'audio/wav', not image data"):
        fetch(f, f"data:audio/wav;base64,{payload}")
    with pytest.raises(InvalidInput, match="base64 is invalid"):
        fetch(f, "data:image/png;base64,@@@@")
    with pytest.raises(InvalidInput, match="more than the limit of 100 bytes"):
        fetch(f, "data:image/png;base64," + base64.b64encode(b"x" * 300).decode())
    with pytest.raises(InvalidInput, match="input 1: a data URI needs a ','"):
        fetch(f, f"data:image/png;base64,{payload}", "data:image/png;base64")


def test_next_address_is_tried_when_one_does_not_connect() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.host)
        if request.url.host == "2606:4700:4700::1111":
            raise httpx.ConnectError("unreachable", request=request)
        return httpx.Response(200, stream=Replay(httpx.Response(200, content=b"v4")))

    async def resolver(host: str, port: int) -> list[str]:
        return ["2606:4700:4700::1111", PUBLIC]

    f = MediaFetcher(FetchPolicy(), resolver=resolver, transport=httpx.MockTransport(handler))
    (media,) = asyncio.run(f.load_all(["http://dual.example/a.png"], Modality.IMAGE))
    assert media.data == b"v4"
    assert seen == ["2606:4700:4700::1111", PUBLIC]


def test_allowed_ipv6_literal_is_fetched_at_that_address() -> None:
    recorder = Recorder({"::1/a.png": httpx.Response(200, content=b"six")})
    (media,) = fetch(fetcher(recorder, allowed_hosts=frozenset({"::1"})), "http://[::1]:8080/a.png")
    assert media.data == b"six"
    assert recorder.seen[0].headers["host"] == "[::1]:8080"


def test_a_host_with_one_private_address_among_public_ones_is_refused() -> None:
    recorder = Recorder({})
    with pytest.raises(InvalidInput, match=r"host 'mixed\.example' resolves to an address that is private;") as refused:
        fetch(fetcher(recorder, {"mixed.example": [PUBLIC, "10.9.9.9"]}), "http://mixed.example/a.png")
    assert "10.9.9.9" not in str(refused.value)
    assert recorder.seen == []


def test_media_settings_from_the_environment() -> None:
    from infinity_server.settings import load_settings

    environ = {
        "INFINITY_SERVER_MEDIA_ALLOWED_HOSTS": "images.internal, 10.1.2.3",
        "INFINITY_SERVER_MAX_AUDIO_SECONDS": "30",
    }
    settings = load_settings(environ=environ)
    assert settings.server.media_allowed_hosts == ("images.internal", "10.1.2.3")
    assert settings.registry.max_audio_seconds == 30
    assert settings.server.media_allow_private is False


def test_embedded_forms_name_the_ipv4_they_carry() -> None:
    reason = refused_reason(ipaddress.ip_address("2002:7f00:1::"))
    assert reason == "loopback (6to4 form of 127.0.0.1)"


def test_a_name_resolving_to_a_6to4_loopback_is_refused() -> None:
    recorder = Recorder({})
    with pytest.raises(InvalidInput, match="loopback"):
        fetch(fetcher(recorder, {"six.example": ["2002:7f00:1::"]}), "http://six.example/a.png")
    assert recorder.seen == []


def test_too_many_urls_are_refused_before_any_is_resolved() -> None:
    recorder, looked_up = Recorder({}), []

    async def resolver(host: str, port: int) -> list[str]:
        looked_up.append(host)
        return [PUBLIC]

    policy = FetchPolicy(max_urls=3)
    f = MediaFetcher(policy, resolver=resolver, transport=httpx.MockTransport(recorder))
    urls = [f"http://photos.example/{i}.png" for i in range(4)]
    with pytest.raises(InvalidInput, match="names 4 URLs, more than the limit of 3"):
        asyncio.run(f.load_all(urls, Modality.IMAGE))
    # Data URIs do not count as URLs; the input count is limited on its own.
    assert len(asyncio.run(f.load_all(["data:,x"] * 5, Modality.IMAGE))) == 5
    with pytest.raises(InvalidInput, match="holds 6 inputs, more than the limit of 5"):
        asyncio.run(MediaFetcher(FetchPolicy(max_inputs=5)).load_all(["data:,x"] * 6, Modality.IMAGE))
    assert looked_up == []
    assert recorder.seen == []


def test_concurrent_fetches_are_bounded_per_request_and_per_server() -> None:
    from infinity_server.fetch.limits import FetchGate

    active, peak = 0, 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.01)
        active -= 1
        return httpx.Response(200, stream=Replay(httpx.Response(200, content=b"ok")))

    async def resolver(host: str, port: int) -> list[str]:
        return [PUBLIC]

    async def run(per_request: int, server: int) -> int:
        nonlocal peak
        peak = 0
        gate = FetchGate(max_fetches=server, max_bytes_in_flight=2**20)
        policy = FetchPolicy(concurrency=per_request)
        f = MediaFetcher(policy, gate=gate, resolver=resolver, transport=httpx.MockTransport(handler))
        urls = [f"http://photos.example/{i}" for i in range(12)]
        await asyncio.gather(f.load_all(urls, Modality.IMAGE), f.load_all(urls, Modality.IMAGE))
        return peak

    assert asyncio.run(run(per_request=3, server=100)) == 6  # two requests of three each
    assert asyncio.run(run(per_request=8, server=4)) == 4  # the server's slots bind first


def test_bytes_held_are_bounded_server_wide_and_released() -> None:
    from infinity_server.fetch.limits import FetchGate
    from model_registry.errors import Overloaded

    recorder = Recorder({f"{PUBLIC}/a.png": httpx.Response(200, content=b"x" * 600)})
    gate = FetchGate(max_fetches=8, max_bytes_in_flight=1000)

    async def resolver(host: str, port: int) -> list[str]:
        return [PUBLIC]

    f = MediaFetcher(FetchPolicy(), gate=gate, resolver=resolver, transport=httpx.MockTransport(recorder))

    async def hold_then_try() -> None:
        async with f.loaded(["http://photos.example/a.png"], Modality.IMAGE):
            assert gate.held == 600
            with pytest.raises(Overloaded, match="media_max_bytes_in_flight"):
                await f.load_all(["http://photos.example/a.png"], Modality.IMAGE)
        assert gate.held == 0
        await f.load_all(["http://photos.example/a.png"], Modality.IMAGE)  # room again

    asyncio.run(hold_then_try())
    assert gate.held == 0


def test_media_that_could_never_fit_the_budget_are_a_400_not_a_429() -> None:
    """Three 600-byte images against a budget of 1,000 held at once: no wait would admit them."""
    from infinity_server.fetch.limits import FetchGate
    from model_registry.errors import InvalidInput

    recorder = Recorder({f"{PUBLIC}/a.png": httpx.Response(200, content=b"x" * 600)})
    gate = FetchGate(max_fetches=8, max_bytes_in_flight=1000)

    async def resolver(host: str, port: int) -> list[str]:
        return [PUBLIC]

    f = MediaFetcher(FetchPolicy(), gate=gate, resolver=resolver, transport=httpx.MockTransport(recorder))
    with pytest.raises(InvalidInput, match=r"more than the server holds for all requests at once \(1,000"):
        asyncio.run(f.load_all(["http://photos.example/a.png"] * 3, Modality.IMAGE))
    assert gate.held == 0


def test_compressed_responses_are_limited_by_their_decompressed_size() -> None:
    import gzip
    import zlib

    packed = gzip.compress(b"\0" * 50_000_000)  # about 50 KB on the wire

    async def bomb() -> AsyncIterator[bytes]:
        yield packed

    small = b"image bytes " * 10
    recorder = Recorder(
        {
            f"{PUBLIC}/bomb": httpx.Response(200, content=bomb(), headers={"content-encoding": "gzip"}),
            f"{PUBLIC}/ok": httpx.Response(200, content=gzip.compress(small), headers={"content-encoding": "gzip"}),
            f"{PUBLIC}/zlib": httpx.Response(
                200, content=zlib.compress(small), headers={"content-encoding": "deflate"}
            ),
            f"{PUBLIC}/br": httpx.Response(200, content=b"??", headers={"content-encoding": "br"}),
        }
    )
    f = fetcher(recorder, max_bytes=1_000_000)
    with pytest.raises(InvalidInput, match="more than the limit of 1,000,000 bytes \\(decompressed\\)"):
        fetch(f, "http://photos.example/bomb")
    assert fetch(f, "http://photos.example/ok")[0].data == small
    assert fetch(f, "http://photos.example/zlib")[0].data == small
    with pytest.raises(InvalidInput, match="Content-Encoding 'br' is not accepted"):
        fetch(f, "http://photos.example/br")
    assert recorder.seen[0].headers["accept-encoding"] == "gzip, deflate"


def test_bounded_decoder_never_inflates_past_the_limit() -> None:
    import gzip

    from infinity_server.fetch.limits import BoundedDecoder, TooLarge

    decoder = BoundedDecoder("gzip", limit=10_000, index=0)
    with pytest.raises(TooLarge):
        decoder.feed(gzip.compress(b"\0" * 100_000_000))
    assert decoder.produced <= 10_001


def test_media_limits_from_the_environment_reach_the_fetcher_and_the_registry() -> None:
    from infinity_server.settings import load_settings
    from model_registry.errors import ConfigError

    environ = {
        "INFINITY_SERVER_MEDIA_MAX_URLS_PER_REQUEST": "5",
        "INFINITY_SERVER_MEDIA_MAX_BYTES_IN_FLIGHT": "1000000",
        "INFINITY_SERVER_MAX_IMAGE_ASPECT_RATIO": "50",
        "INFINITY_SERVER_MAX_AUDIO_SAMPLES": "123456",
    }
    settings = load_settings(environ=environ)
    assert settings.server.media_max_urls_per_request == 5
    assert settings.server.media_max_bytes_in_flight == 1_000_000
    assert settings.registry.max_image_aspect_ratio == 50
    assert settings.registry.max_audio_samples == 123_456
    assert settings.registry.max_media_expansion == 256  # the default
    with pytest.raises(ConfigError, match="media_fetch_concurrency"):
        load_settings(environ={"INFINITY_SERVER_MEDIA_FETCH_CONCURRENCY": "0"})


def test_an_empty_list_fetches_nothing() -> None:
    recorder = Recorder({})
    assert fetch(fetcher(recorder)) == []
    assert recorder.seen == []


def embedding_forms(ipv4: str) -> dict[str, str]:
    """Each IPv6 form that carries `ipv4`, built by hand from its RFC's layout."""
    n = int(ipaddress.IPv4Address(ipv4))
    high, low = f"{n >> 16:x}", f"{n & 0xFFFF:x}"
    hidden = n ^ 0xFFFFFFFF  # Teredo obfuscates the client's address
    return {
        "IPv4-mapped": f"::ffff:{ipv4}",
        "IPv4-compatible": f"::{ipv4}",
        "NAT64": f"64:ff9b::{ipv4}",
        "NAT64 local-use": f"64:ff9b:1::{ipv4}",
        "6to4": f"2002:{high}:{low}::1",
        "Teredo server": f"2001:0:{high}:{low}:8000:0:a2ff:fff1",
        "Teredo client": f"2001:0:5db8:d70e:8000:0:{hidden >> 16:x}:{hidden & 0xFFFF:x}",
        "ISATAP": f"2600:1f18::5efe:{ipv4}",
        "ISATAP universal": f"2600:1f18::200:5efe:{ipv4}",
    }


REFUSED_IPV4 = ["127.0.0.1", "10.0.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "224.0.0.1", "240.0.0.1"]


@pytest.mark.parametrize("form", list(embedding_forms(PUBLIC)))
@pytest.mark.parametrize("ipv4", REFUSED_IPV4)
def test_every_embedding_form_is_refused_like_the_ipv4_it_carries(ipv4: str, form: str) -> None:
    own = refused_reason(ipaddress.IPv4Address(ipv4))
    assert own is not None
    found = refused_reason(ipaddress.ip_address(embedding_forms(ipv4)[form]))
    assert found is not None
    assert found.startswith(own)
    assert f"form of {ipv4})" in found


@pytest.mark.parametrize(
    ("form", "refused"),
    [
        ("IPv4-mapped", False),
        ("NAT64", False),
        ("6to4", False),
        ("ISATAP", False),
        ("ISATAP universal", False),
        ("IPv4-compatible", True),  # `::/8` is reserved: only the private forms of it mean anything
        ("NAT64 local-use", True),  # never public, whatever it carries
        ("Teredo server", True),  # a Teredo address is never public
        ("Teredo client", True),
    ],
)
def test_a_public_ipv4_in_each_form(form: str, refused: bool) -> None:
    assert ipaddress.IPv4Address(PUBLIC).is_global
    found = refused_reason(ipaddress.ip_address(embedding_forms(PUBLIC)[form]))
    assert (found is not None) == refused, found


@pytest.mark.parametrize(
    ("resolved", "kind"),
    [
        ("169.254.169.254", "link-local"),
        ("2600:1f18::5efe:a9fe:a9fe", "link-local"),
        ("2002:7f00:1::", "loopback"),
        ("fec0::1", "site-local"),
        ("10.20.30.40", "private"),
    ],
)
def test_a_refused_name_is_named_never_its_resolved_address(resolved: str, kind: str) -> None:
    recorder = Recorder({})
    with pytest.raises(
        InvalidInput, match=rf"input 0: the URL's host 'inside\.example' resolves to an address that is {kind}"
    ) as error:
        fetch(fetcher(recorder, {"inside.example": [resolved]}), "http://inside.example/a.png")
    message = str(error.value)
    carried = [str(inner) for _, inner in embedded_ipv4(ipaddress.ip_address(resolved))]
    for secret in [resolved, ipaddress.ip_address(resolved).exploded, *carried]:
        assert secret not in message, message
    assert recorder.seen == []


def test_a_failed_connection_names_the_host_not_its_address() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"connection to ('{request.url.host}', 80) refused", request=request)

    async def resolver(host: str, port: int) -> list[str]:
        return ["10.7.7.7"]

    policy = FetchPolicy(allowed_hosts=frozenset({"intranet.example"}))
    f = MediaFetcher(policy, resolver=resolver, transport=httpx.MockTransport(refuse))
    with pytest.raises(InvalidInput, match=r"input 0: fetching http://intranet\.example/a\.png failed") as error:
        asyncio.run(f.load_all(["http://intranet.example/a.png"], Modality.IMAGE))
    assert "10.7.7.7" not in str(error.value)
    assert "('intranet.example', 80)" in str(error.value)


def test_a_given_client_serves_every_call_and_no_other_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = Recorder({f"{PUBLIC}/a.png": httpx.Response(200, content=b"png!")})
    client = media_client(5.0, httpx.MockTransport(recorder))
    made: list[object] = []

    class Counted(httpx.AsyncClient):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            made.append(self)

    monkeypatch.setattr(httpx, "AsyncClient", Counted)
    f = MediaFetcher(FetchPolicy(), resolver=public_resolver, client=client)

    async def two_calls() -> None:
        for _ in range(2):
            assert (await f.load_all(["http://photos.example/a.png"], Modality.IMAGE))[0].data == b"png!"
        assert not client.is_closed  # the fetcher borrows it; the app closes it
        await client.aclose()

    asyncio.run(two_calls())
    assert made == []
    assert len(recorder.seen) == 2


def test_the_app_s_client_is_made_once_and_closed_at_shutdown() -> None:
    state = SimpleNamespace()
    first = shared_media_client(state, 5.0)
    assert shared_media_client(state, 5.0) is first
    asyncio.run(close_media_client(state))
    assert first.is_closed
    assert state.media_client is None
    asyncio.run(close_media_client(state))  # a second close, or one with no client made, is harmless


async def public_resolver(host: str, port: int) -> list[str]:
    return [PUBLIC]
