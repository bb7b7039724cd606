"""Hostile media over HTTP: each is a clear 4xx naming what was wrong, and the server stays healthy."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.builders.media import image_bytes, lying_wav, one_colour_png, tiny_clap, tiny_clip, wav_bytes
from tests.conftest import LiveServer
from tests.integration.media_setup import data_uri, media_server
from tests.media_http import file_server

pytestmark = pytest.mark.integration

PHOTO = "cats_coco_sample.jpg"
BODY_LIMIT = 300_000


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("guarded-models")
    return {"clip": tiny_clip(root / "clip"), "clap": tiny_clap(root / "clap")}


@pytest.fixture(scope="module")
def files(data_dir: Path) -> Iterator[tuple[str, list[str]]]:
    with file_server(data_dir) as served:
        yield served


@pytest.fixture(scope="module")
def strict(models: dict[str, Path]) -> Iterator[httpx.Client]:
    """Default media policy: no private address is allowed. 60,000 samples fit a 1-second clip at
    CLAP's 48 kHz with the resampler's margin, not 2 seconds of audio resampled to it."""
    registry = {"max_audio_seconds": 2.0, "max_audio_samples": 60_000}
    with media_server(models, registry, max_body_bytes=BODY_LIMIT) as live, live.client() as client:
        yield client


@pytest.fixture(scope="module")
def trusting(models: dict[str, Path]) -> Iterator[LiveServer]:
    """Allows exactly the host 127.0.0.1 (the test file server), nothing else private."""
    with media_server(models, media_allowed_hosts=("127.0.0.1",), media_max_bytes=1_000_000) as live:
        yield live


def assert_refused(response: httpx.Response, status: int, *phrases: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    for phrase in phrases:
        assert phrase in error["message"], error["message"]


def assert_healthy(client: httpx.Client) -> None:
    assert client.get("/health").status_code == 200
    ok = client.post("/v1/embeddings", json={"model": "clip", "input": ["still here"]})
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("127.0.0.1:{port}", "loopback"),
        ("[::1]:{port}", "loopback"),
        ("10.0.0.1", "private"),
        ("169.254.169.254", "link-local"),
        ("localhost:{port}", "loopback"),
        ("[fec0::1]", "site-local"),
        ("[2600:1f18::5efe:a9fe:a9fe]", "(ISATAP form of 169.254.169.254)"),
        ("[2600:1f18::200:5efe:a9fe:a9fe]", "(ISATAP form of 169.254.169.254)"),
    ],
)
def test_private_urls_are_refused(strict: httpx.Client, files: tuple[str, list[str]], host: str, reason: str) -> None:
    base, hits = files
    port = base.rsplit(":", 1)[1]
    before = len(hits)
    url = f"http://{host.format(port=port)}/{PHOTO}"
    payload = {"model": "clip", "input": ["data:,x", url], "modality": "image"}
    assert_refused(strict.post("/v1/embeddings", json=payload), 400, "input 1", reason)
    assert len(hits) == before  # never connected: the loopback file server saw nothing
    assert_healthy(strict)


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://127.0.0.1/cats.jpg"])
def test_other_schemes_are_refused(strict: httpx.Client, url: str) -> None:
    response = strict.post("/embeddings_image", json={"model": "clip", "input": [url]})
    assert_refused(response, 400, "input 0", "URLs are not fetched")
    assert_healthy(strict)


@pytest.mark.parametrize(
    "target", ["http://localhost:{port}/" + PHOTO, "http://10.0.0.1/x.jpg", "http://[::1]:{port}/"]
)
def test_redirect_from_an_allowed_host_to_a_private_one(
    trusting: LiveServer, files: tuple[str, list[str]], target: str
) -> None:
    base, hits = files
    port = base.rsplit(":", 1)[1]
    with trusting.client() as client:
        direct = client.post("/embeddings_image", json={"model": "clip", "input": [f"{base}/{PHOTO}"]})
        assert direct.status_code == 200, direct.text  # the allowed host itself is fetched
        before = len(hits)
        url = f"{base}/redirect?to={target.format(port=port)}"
        response = client.post("/embeddings_image", json={"model": "clip", "input": [url]})
        assert_refused(response, 400, "input 0", "address")
        assert [h.split("?")[0] for h in hits[before:]] == ["/redirect"]  # the private target was never reached
        assert_healthy(client)


def test_remote_file_over_the_byte_limit(trusting: LiveServer, files: tuple[str, list[str]]) -> None:
    base, _ = files
    with trusting.client() as client:
        response = client.post("/embeddings_image", json={"model": "clip", "input": [f"{base}/big"]})
        assert_refused(response, 400, "input 0", "more than the limit of 1,000,000 bytes")
        assert_healthy(client)


def test_media_no_wait_would_admit_are_a_400_not_a_429(models: dict[str, Path], files: tuple[str, list[str]]) -> None:
    """Two 173 KB photos against 300,000 bytes held at once for all requests: a retry never fits
    them, so the answer is no 429 (which a batch line or a client would retry for ever)."""
    base, _ = files
    photo = f"{base}/{PHOTO}"
    allowed: dict[str, Any] = {"media_allowed_hosts": ("127.0.0.1",), "media_max_bytes_in_flight": 300_000}
    with media_server(models, **allowed) as live, live.client() as client:
        one = client.post("/embeddings_image", json={"model": "clip", "input": [photo]})
        two = client.post("/embeddings_image", json={"model": "clip", "input": [photo, photo]})
        assert one.status_code == 200, one.text
        assert_refused(two, 400, "more than the server holds for all requests at once (300,000")
        assert_healthy(client)


def test_decompression_bomb(strict: httpx.Client) -> None:
    bomb = one_colour_png(20_000)
    files = [("file", ("bomb.png", bomb, "image/png"))]
    response = strict.post("/v1/embeddings/upload", data={"model": "clip"}, files=files)
    assert_refused(response, 400, "input 0", "pixels")
    assert_healthy(strict)


def test_truncated_jpeg(strict: httpx.Client, data_dir: Path) -> None:
    photo = (data_dir / PHOTO).read_bytes()
    uris = [data_uri(image_bytes(20, 20), "image/png"), data_uri(photo[: len(photo) // 2], "image/jpeg")]
    response = strict.post("/v1/embeddings", json={"model": "clip", "input": uris, "modality": "image"})
    assert_refused(response, 400, "input 1", "corrupt or truncated")
    assert_healthy(strict)


def test_wav_whose_header_lies(strict: httpx.Client) -> None:
    files = [("file", ("liar.wav", lying_wav(16000 * 3600, 1600), "audio/wav"))]
    response = strict.post("/v1/embeddings/upload", data={"model": "clap"}, files=files)
    assert_refused(response, 400, "input 0", "WAV header declares")
    assert_healthy(strict)


def test_audio_longer_than_the_limit(strict: httpx.Client) -> None:
    long_clip = wav_bytes(3.0, rate=8000)
    response = strict.post("/embeddings_audio", json={"model": "clap", "input": [data_uri(long_clip, "audio/wav")]})
    assert_refused(response, 400, "input 0", "longer than the limit of 2s")
    assert_healthy(strict)


def test_body_over_the_upload_limit(strict: httpx.Client) -> None:
    files = [("file", ("noise.wav", wav_bytes(1.0, rate=BODY_LIMIT // 2), "audio/wav"))]
    response = strict.post("/v1/embeddings/upload", data={"model": "clap"}, files=files)
    assert_refused(response, 413, "larger than the limit")
    assert_healthy(strict)


def test_wrong_modality_and_unknown_model(strict: httpx.Client, data_dir: Path) -> None:
    photo = (data_dir / PHOTO).read_bytes()
    to_clap = strict.post("/v1/embeddings/upload", data={"model": "clap"}, files=[("f", (PHOTO, photo, "image/jpeg"))])
    assert_refused(to_clap, 400, "input 0", "cannot embed image")
    unknown = strict.post("/embeddings_image", json={"model": "nope", "input": [data_uri(photo, "image/jpeg")]})
    assert unknown.status_code == 404
    text_file = strict.post(
        "/v1/embeddings/upload", data={"model": "clip"}, files=[("f", ("a.txt", io.BytesIO(b"hi"), "text/plain"))]
    )
    assert_refused(text_file, 400, "input 0", "content type 'text/plain'")
    not_multipart = strict.post("/v1/embeddings/upload", json={"model": "clip"})
    assert not_multipart.status_code == 415
    assert_healthy(strict)


def test_a_refused_name_is_named_never_its_resolved_address(strict: httpx.Client, files: tuple[str, list[str]]) -> None:
    base, hits = files
    port = base.rsplit(":", 1)[1]
    before = len(hits)
    response = strict.post("/embeddings_image", json={"model": "clip", "input": [f"http://localhost:{port}/{PHOTO}"]})
    assert_refused(response, 400, "input 0", "the URL's host 'localhost' resolves to an address that is loopback")
    message = response.json()["error"]["message"]
    assert "127.0.0.1" not in message
    assert "::1" not in message
    assert len(hits) == before
    assert_healthy(strict)


def test_audio_at_a_very_low_rate_is_refused_by_its_resampled_length(strict: httpx.Client) -> None:
    """Two frames at 1 Hz pass any frame count; at CLAP's 48 kHz they are 96,000 samples."""
    clip = wav_bytes(2.0, rate=1)
    files = [("file", ("slow.wav", clip, "audio/wav"))]
    response = strict.post("/v1/embeddings/upload", data={"model": "clap"}, files=files)
    assert_refused(
        response,
        400,
        "input 0",
        "2 frames at 1 Hz would resample to 96,000 samples at 48,000 Hz, more than the limit of 60,000",
    )
    assert_healthy(strict)


def test_media_requests_share_one_http_client(
    models: dict[str, Path], files: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[object] = []

    class Counted(httpx.AsyncClient):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            made.append(self)

    base, _ = files
    monkeypatch.setattr(httpx, "AsyncClient", Counted)
    clip_only = {"clip": models["clip"]}
    with media_server(clip_only, media_allowed_hosts=("127.0.0.1",)) as live, live.client() as client:
        for _ in range(2):
            payload = {"model": "clip", "input": [f"{base}/{PHOTO}", f"{base}/{PHOTO}"]}
            assert client.post("/embeddings_image", json=payload).status_code == 200
    assert len(made) == 1
