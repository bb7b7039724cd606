"""CLIP, open_clip, CLAP and ColPali over HTTP: parity with their reference libraries on the same
weights, the real photo and WAVs by URL, data URI and upload, batched equals single, image rerank."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from tests.builders.media import image_bytes
from tests.conftest import LiveServer
from tests.integration.media_setup import MIME, build_models, data_uri, media_server
from tests.media_http import file_server
from tests.waiting import eventually_async

pytestmark = pytest.mark.integration

PHOTO, BEEP, MEOW = "cats_coco_sample.jpg", "beep.wav", "cat_meow.wav"
TOL = 1e-4


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_models(tmp_path_factory.mktemp("media-models"))


@pytest.fixture(scope="module")
def files(data_dir: Path) -> Iterator[tuple[str, list[str]]]:
    with file_server(data_dir) as served:
        yield served


@pytest.fixture(scope="module")
def server(models: dict[str, Path]) -> Iterator[LiveServer]:
    # The test file server runs on loopback: this configuration explicitly allows that one host.
    # JPEGs are decoded whole, as the references do, so that parity holds to float rounding
    # (the reduced decoding has its own parity tests, in tests/unit/test_scaled_jpeg.py).
    with media_server(models, {"scaled_jpeg": False}, media_allowed_hosts=("127.0.0.1",)) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def vectors(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    body = response.json()
    assert [d["index"] for d in body["data"]] == list(range(len(body["data"])))
    return np.array([d["embedding"] for d in body["data"]], dtype=np.float32)


def embed(client: httpx.Client, model: str, inputs: list[str], modality: str = "text") -> np.ndarray:
    return vectors(client.post("/v1/embeddings", json={"model": model, "input": inputs, "modality": modality}))


def upload(client: httpx.Client, model: str, files: list[tuple[str, bytes]], **fields: str) -> httpx.Response:
    parts = [("file", (name, data, MIME[Path(name).suffix])) for name, data in files]
    return client.post("/v1/embeddings/upload", data={"model": model, **fields}, files=parts)


def photo_variants(data_dir: Path) -> list[bytes]:
    """The real photo, cropped and resized three ways (JPEG and PNG)."""
    from PIL import Image

    photo = Image.open(data_dir / PHOTO).convert("RGB")
    out = []
    for box, size, fmt in (
        ((0, 0, 300, 200), (90, 60), "JPEG"),
        ((100, 50, 400, 450), (64, 64), "PNG"),
        (None, (50, 120), "PNG"),
    ):
        buffer = io.BytesIO()
        (photo.crop(box) if box else photo).resize(size).save(buffer, format=fmt)
        out.append(buffer.getvalue())
    return out


# ---- parity with the reference libraries -----------------------------------------------------------


def test_clip_parity_with_transformers(client: httpx.Client, models: dict[str, Path], data_dir: Path) -> None:
    from PIL import Image
    from transformers import AutoTokenizer, CLIPImageProcessor, CLIPModel

    texts = ["a photo of two cats", "a plane is taking off from the airport, seen from far away"]
    photo = (data_dir / PHOTO).read_bytes()
    got_text = embed(client, "clip", texts)
    got_image = embed(client, "clip", [data_uri(photo, "image/jpeg")], "image")

    model = CLIPModel.from_pretrained(models["clip"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(models["clip"])
    processor = CLIPImageProcessor.from_pretrained(models["clip"])
    with torch.inference_mode():
        tokens = tokenizer(texts, padding=True, truncation=True, max_length=32, return_tensors="pt")
        want_text = model.get_text_features(**tokens).pooler_output.numpy()
        pixels = processor(images=Image.open(io.BytesIO(photo)).convert("RGB"), return_tensors="pt")
        want_image = model.get_image_features(**pixels).pooler_output.numpy()
    np.testing.assert_allclose(got_text, want_text, atol=TOL)
    np.testing.assert_allclose(got_image, want_image, atol=TOL)


def test_siglip_parity_with_transformers(client: httpx.Client, models: dict[str, Path], data_dir: Path) -> None:
    from PIL import Image
    from transformers import AutoTokenizer, SiglipImageProcessor, SiglipModel

    texts = ["two cats", "a plane is taking off", " ".join(["the cat sleeps on the warm windowsill"] * 5)]
    photo = (data_dir / PHOTO).read_bytes()
    got_text = embed(client, "siglip", texts)
    got_image = embed(client, "siglip", [data_uri(photo, "image/jpeg")], "image")

    model = SiglipModel.from_pretrained(models["siglip"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(models["siglip"])
    processor = SiglipImageProcessor.from_pretrained(models["siglip"])
    with torch.inference_mode():
        # SigLIP's processor pads texts to the full length; its tokenizer's mask goes to the text tower.
        tokens = tokenizer(texts, padding="max_length", truncation=True, max_length=16, return_tensors="pt")
        mask = tokens.get("attention_mask")
        want_text = model.get_text_features(input_ids=tokens.input_ids, attention_mask=mask).pooler_output.numpy()
        pixels = processor(images=Image.open(io.BytesIO(photo)).convert("RGB"), return_tensors="pt")
        want_image = model.get_image_features(**pixels).pooler_output.numpy()
    np.testing.assert_allclose(got_text, want_text, atol=TOL)
    np.testing.assert_allclose(got_image, want_image, atol=TOL)


def test_open_clip_parity(client: httpx.Client, models: dict[str, Path], data_dir: Path) -> None:
    import open_clip
    from PIL import Image

    texts = ["two cats on a sofa", "hello world"]
    photo = (data_dir / PHOTO).read_bytes()
    got_text = embed(client, "open-clip", texts)
    got_image = embed(client, "open-clip", [data_uri(photo, "image/jpeg")], "image")

    name = f"local-dir:{models['open-clip']}"
    model, _, preprocess = open_clip.create_model_and_transforms(name)
    tokenizer = open_clip.get_tokenizer(name)
    model.eval()
    with torch.inference_mode():
        want_text = model.encode_text(tokenizer(texts)).numpy()
        image = preprocess(Image.open(io.BytesIO(photo)).convert("RGB")).unsqueeze(0)
        want_image = model.encode_image(image).numpy()
    np.testing.assert_allclose(got_text, want_text, atol=TOL)
    np.testing.assert_allclose(got_image, want_image, atol=TOL)


def test_clap_parity_with_transformers(client: httpx.Client, models: dict[str, Path], data_dir: Path) -> None:
    import soundfile
    from transformers import AutoTokenizer, ClapFeatureExtractor, ClapModel

    texts = ["a cat meows", "a short beep", " ".join(["a cat meows loudly in the kitchen"] * 10)]
    beep = (data_dir / BEEP).read_bytes()
    got_text = embed(client, "clap", texts)
    got_audio = embed(client, "clap", [data_uri(beep, "audio/wav")], "audio")

    model = ClapModel.from_pretrained(models["clap"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(models["clap"])
    extractor = ClapFeatureExtractor.from_pretrained(models["clap"])
    samples, rate = soundfile.read(io.BytesIO(beep), dtype="float32")
    assert rate == extractor.sampling_rate  # 48 kHz file, 48 kHz model: no resampling on either side
    with torch.inference_mode():
        tokens = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        assert tokens["input_ids"].shape[1] == 32  # the long text is cut to the tokenizer's limit
        want_text = model.get_text_features(**tokens).pooler_output
        features = extractor(samples, sampling_rate=rate, return_tensors="pt")
        want_audio = model.get_audio_features(**features).pooler_output
    np.testing.assert_allclose(got_text, want_text.numpy(), atol=TOL)
    np.testing.assert_allclose(got_audio, want_audio.numpy(), atol=TOL)


def colpali_reference(path: Path, photo: bytes, query: str) -> tuple[np.ndarray, np.ndarray]:
    """The model's own outputs for one page and one query (ColPali, ColQwen2 or ColModernVBert, by the
    directory)."""
    import transformers
    from PIL import Image

    config = json.loads((path / "config.json").read_text())
    model = getattr(transformers, config["architectures"][0]).from_pretrained(path).eval()
    processor = transformers.AutoProcessor.from_pretrained(path)
    keys = ("input_ids", "attention_mask", "token_type_ids", "pixel_values", "image_grid_thw", "pixel_attention_mask")
    with torch.inference_mode():
        page = processor.process_images([Image.open(io.BytesIO(photo)).convert("RGB")])
        page_vectors = model(**{k: page[k] for k in keys if k in page}).embeddings[0].numpy()
        asked = processor.process_queries([query])
        query_vectors = model(**{k: asked[k] for k in keys if k in asked}).embeddings[0].numpy()
    return page_vectors, query_vectors


def multivectors(response: httpx.Response) -> list[np.ndarray]:
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    out = [np.array(d["embedding"], dtype=np.float32) for d in data]
    assert [list(v.shape) for v in out] == [d["shape"] for d in data]
    return out


@pytest.mark.parametrize("model", ["colpali", "colqwen2", "colqwen2.5", "colmodernvbert"])
def test_page_model_parity_with_transformers(
    client: httpx.Client, models: dict[str, Path], data_dir: Path, model: str
) -> None:
    photo = (data_dir / PHOTO).read_bytes()
    query = "where are the cats?"
    parts: list[tuple[str, Any]] = [("input", (None, query)), ("file", (PHOTO, photo, "image/jpeg"))]
    response = client.post("/v1/embeddings/upload", data={"model": model, "output": "multivector"}, files=parts)
    got_query, got_page = multivectors(response)
    want_page, want_query = colpali_reference(models[model], photo, query)
    np.testing.assert_allclose(got_page, want_page, atol=TOL)
    np.testing.assert_allclose(got_query, want_query, atol=TOL)


# ---- the real files by URL, data URI and upload ------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "name", "modality", "route"),
    [
        ("clip", PHOTO, "image", "/embeddings_image"),
        ("open-clip", PHOTO, "image", "/embeddings_image"),
        ("clap", BEEP, "audio", "/embeddings_audio"),
        ("clap", MEOW, "audio", "/embeddings_audio"),
    ],
)
def test_url_data_uri_and_upload_give_identical_embeddings(
    client: httpx.Client, files: tuple[str, list[str]], data_dir: Path, model: str, name: str, modality: str, route: str
) -> None:
    base, hits = files
    data = (data_dir / name).read_bytes()
    by_url = embed(client, model, [f"{base}/{name}"], modality)
    assert f"/{name}" in hits
    by_data_uri = embed(client, model, [data_uri(data, MIME[Path(name).suffix])], modality)
    by_upload = vectors(upload(client, model, [(name, data)]))
    by_infinity = vectors(client.post(route, json={"model": model, "input": [f"{base}/{name}"]}))
    assert by_url.shape == (1, 16)
    np.testing.assert_array_equal(by_url, by_data_uri)
    np.testing.assert_array_equal(by_url, by_upload)
    np.testing.assert_array_equal(by_url, by_infinity)


def test_colpali_page_by_url_equals_upload(client: httpx.Client, files: tuple[str, list[str]], data_dir: Path) -> None:
    base, _ = files
    photo = (data_dir / PHOTO).read_bytes()
    query = "where are the cats?"
    parts: list[tuple[str, Any]] = [("input", (None, query)), ("file", (PHOTO, photo, "image/jpeg"))]
    response = client.post("/v1/embeddings/upload", data={"model": "colpali", "output": "multivector"}, files=parts)
    asked, page = multivectors(response)
    by_url = client.post(
        "/v1/rerank/images", json={"model": "colpali", "query": query, "documents": [f"{base}/{PHOTO}"]}
    )
    by_upload = client.post(
        "/v1/rerank/images/upload",
        data={"model": "colpali", "query": query},
        files=[("f", (PHOTO, photo, "image/jpeg"))],
    )
    assert by_url.status_code == by_upload.status_code == 200, (by_url.text, by_upload.text)
    score = by_url.json()["results"][0]["relevance_score"]
    assert score == by_upload.json()["results"][0]["relevance_score"]
    assert score == pytest.approx(float((asked @ page.T).max(axis=1).sum()), abs=1e-4)


def test_a_slow_fetch_does_not_hold_up_other_requests(
    server: LiveServer, files: tuple[str, list[str]], data_dir: Path
) -> None:
    base, hits = files
    photo = data_uri((data_dir / PHOTO).read_bytes(), "image/jpeg")
    slow_path = f"/slow/{PHOTO}"
    fetched_before = hits.count(slow_path)

    async def slow_fetch_begun() -> bool:
        return hits.count(slow_path) > fetched_before

    async def both() -> tuple[float, float]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:

            async def timed(inputs: list[str]) -> float:
                response = await http.post(
                    "/v1/embeddings", json={"model": "clip", "input": inputs, "modality": "image"}
                )
                assert response.status_code == 200, response.text
                return time.monotonic()

            slow = asyncio.create_task(timed([base + slow_path]))
            await eventually_async(slow_fetch_begun)  # the file server holds it for a second from here
            fast_done = await timed([photo])
            return fast_done, await slow

    fast_done, slow_done = asyncio.run(both())
    assert fast_done < slow_done - 0.3  # the fast request finished while the slow URL was still being fetched


# ---- batched equals single ------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["clip", "siglip", "open-clip"])
def test_images_batched_equal_single(client: httpx.Client, data_dir: Path, model: str) -> None:
    images = [*photo_variants(data_dir), image_bytes(40, 30, fmt="PNG")]
    uris = [data_uri(b, "image/png") for b in images]
    batched = embed(client, model, uris, "image")
    single = np.concatenate([embed(client, model, [u], "image") for u in uris])
    np.testing.assert_allclose(batched, single, atol=1e-5)
    assert not np.allclose(batched[0], batched[1])


def test_audio_batched_equals_single(client: httpx.Client, data_dir: Path) -> None:
    from tests.builders.media import wav_bytes

    clips = [(data_dir / BEEP).read_bytes(), (data_dir / MEOW).read_bytes(), wav_bytes(0.7, rate=22050, channels=2)]
    batched = vectors(upload(client, "clap", [(f"{i}.wav", c) for i, c in enumerate(clips)]))
    single = np.concatenate([vectors(upload(client, "clap", [("x.wav", c)])) for c in clips])
    np.testing.assert_allclose(batched, single, atol=1e-5)


@pytest.mark.parametrize("model", ["colpali", "colqwen2", "colqwen2.5", "colmodernvbert"])
def test_pages_batched_equal_single(client: httpx.Client, data_dir: Path, model: str) -> None:
    pages = photo_variants(data_dir)
    batched = multivectors(upload(client, model, [(f"{i}.png", p) for i, p in enumerate(pages)], output="multivector"))
    if model != "colpali":  # pages of other shapes have other token counts: padding is exercised
        assert len({len(v) for v in batched}) > 1
    for page, together in zip(pages, batched, strict=True):
        (alone,) = multivectors(upload(client, model, [("p.png", page)], output="multivector"))
        np.testing.assert_allclose(together, alone, atol=1e-5)


def test_text_and_images_mix_in_one_request(client: httpx.Client, data_dir: Path) -> None:
    photo = (data_dir / PHOTO).read_bytes()
    parts: list[tuple[str, Any]] = [
        ("input", (None, "two cats")),
        ("file", (PHOTO, photo, "image/jpeg")),
        ("input", (None, "a dog")),
    ]
    mixed = vectors(client.post("/v1/embeddings/upload", data={"model": "clip"}, files=parts))
    np.testing.assert_allclose(mixed[[0, 2]], embed(client, "clip", ["two cats", "a dog"]), atol=1e-5)
    np.testing.assert_allclose(mixed[1], embed(client, "clip", [data_uri(photo, "image/jpeg")], "image")[0], atol=1e-5)


def test_input_objects_give_texts_and_images_and_a_model_without_mixed_inputs_refuses_both(
    client: httpx.Client, data_dir: Path
) -> None:
    photo = data_uri((data_dir / PHOTO).read_bytes(), "image/jpeg")
    body = {"model": "clip", "input": ["two cats", {"image": photo}, {"text": "a dog"}]}
    objects = vectors(client.post("/v1/embeddings", json=body))
    np.testing.assert_allclose(objects[[0, 2]], embed(client, "clip", ["two cats", "a dog"]), atol=1e-5)
    np.testing.assert_allclose(objects[1], embed(client, "clip", [photo], "image")[0], atol=1e-5)
    refused = client.post(
        "/v1/embeddings", json={"model": "clip", "input": ["a", {"text": "two cats", "image": photo}]}
    )
    assert refused.status_code == 400, refused.text
    message = refused.json()["error"]["message"]
    assert "input 1 holds a text and an image together" in message
    assert "takes one text or one image per input" in message
    ranked = {"model": "clip", "query": "two cats", "documents": [photo, {"image": photo, "text": "two cats"}]}
    refused = client.post("/v1/rerank/images", json=ranked)
    assert refused.status_code == 400, refused.text
    assert "takes one text or one image per input" in refused.json()["error"]["message"]


# ---- rerank of images against a text query -----------------------------------------------------------


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    scores: np.ndarray = (b @ a) / (np.linalg.norm(b, axis=1) * np.linalg.norm(a))
    return scores


def test_clip_image_rerank_is_cosine(client: httpx.Client, data_dir: Path) -> None:
    uris = [data_uri(b, "image/png") for b in photo_variants(data_dir)]
    response = client.post(
        "/v1/rerank/images", json={"model": "clip", "query": "two cats", "documents": uris, "top_n": 2}
    )
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    want = cosine(embed(client, "clip", ["two cats"])[0], embed(client, "clip", uris, "image"))
    order = np.argsort(-want)[:2]
    assert [r["index"] for r in results] == order.tolist()
    np.testing.assert_allclose([r["relevance_score"] for r in results], want[order], atol=1e-5)


def test_colpali_image_rerank_is_maxsim(client: httpx.Client, models: dict[str, Path], data_dir: Path) -> None:
    pages = photo_variants(data_dir)
    query = "where are the cats?"
    parts: list[tuple[str, Any]] = [(f"file{i}", (f"{i}.png", p, "image/png")) for i, p in enumerate(pages)]
    response = client.post("/v1/rerank/images/upload", data={"model": "colpali", "query": query}, files=parts)
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert sorted(r["index"] for r in results) == [0, 1, 2]
    assert [r["document"] for r in results] == [f"{r['index']}.png" for r in results]
    for result in results:
        page, asked = colpali_reference(models["colpali"], pages[result["index"]], query)
        want = float((asked @ page.T).max(axis=1).sum())
        assert result["relevance_score"] == pytest.approx(want, abs=1e-3)
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)


def test_models_report_their_kind(client: httpx.Client) -> None:
    kinds = {m["id"]: (m["kind"], m["capabilities"]) for m in client.get("/v1/models").json()["data"]}
    assert kinds["clip"] == ("image_text", ["embed_image", "embed_text"])
    assert kinds["open-clip"][0] == "image_text"
    assert kinds["siglip"][0] == "image_text"
    assert kinds["clap"] == ("audio_text", ["embed_audio", "embed_text"])
    assert kinds["colpali"] == ("page_text", ["embed_image", "embed_text", "multivector"])
    assert kinds["colqwen2"] == ("page_text", ["embed_image", "embed_text", "multivector"])
    assert kinds["colmodernvbert"] == ("page_text", ["embed_image", "embed_text", "multivector"])


def test_page_models_answer_only_multivector_requests(client: httpx.Client, data_dir: Path) -> None:
    photo = data_uri((data_dir / PHOTO).read_bytes(), "image/jpeg")
    response = client.post("/v1/embeddings", json={"model": "colpali", "input": [photo], "modality": "image"})
    assert response.status_code == 400, response.text
    assert "multivector" in response.json()["error"]["message"]
    dense_only = upload(client, "clip", [(PHOTO, (data_dir / PHOTO).read_bytes())], output="multivector")
    assert dense_only.status_code == 400, dense_only.text
    assert "cannot produce multivector" in dense_only.json()["error"]["message"]


def test_upload_options(client: httpx.Client, data_dir: Path) -> None:
    photo = (data_dir / PHOTO).read_bytes()
    full = vectors(upload(client, "clip", [(PHOTO, photo)]))[0]
    cut = vectors(upload(client, "clip", [(PHOTO, photo)], dimensions="8"))[0]
    np.testing.assert_allclose(cut, full[:8] / np.linalg.norm(full[:8]), atol=1e-6)
    as_base64 = upload(client, "clip", [(PHOTO, photo)], encoding_format="base64").json()["data"][0]["embedding"]
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(as_base64), dtype="<f4"), full)
    fields = (("dimensions", "eight"), ("dimensions", "²"), ("dimensions", "9" * 5000), ("output", "sparse"))
    for name, value in (*fields, ("encoding_format", "hex")):
        bad = upload(client, "clip", [(PHOTO, photo)], **{name: value})
        assert bad.status_code == 400, bad.text
        assert bad.json()["error"]["param"] == name
    files = [(f"f{i}", (f"{i}.png", p, "image/png")) for i, p in enumerate(photo_variants(data_dir))]
    for bad_top in ("²", "9" * 5000):
        refused = client.post(
            "/v1/rerank/images/upload", data={"model": "clip", "query": "q", "top_n": bad_top}, files=files
        )
        assert refused.status_code == 400, refused.text
    top = client.post("/v1/rerank/images/upload", data={"model": "clip", "query": "cats", "top_n": "1"}, files=files)
    assert top.status_code == 200, top.text
    assert len(top.json()["results"]) == 1
    missing = client.post("/v1/rerank/images/upload", data={"model": "clip"}, files=files)
    assert missing.status_code == 422
    assert missing.json()["error"]["param"] == "query"


# ---- documents as pages ------------------------------------------------------------------------------


def pdf_of(pictures: list[bytes]) -> bytes:
    """A PDF with one page per picture, written by Pillow."""
    from PIL import Image

    pages = [Image.open(io.BytesIO(p)).convert("RGB") for p in pictures]
    buffer = io.BytesIO()
    pages[0].save(buffer, format="PDF", save_all=True, append_images=pages[1:], resolution=72)
    return buffer.getvalue()


def rendered_pages(path: Path, document: bytes) -> list[bytes]:
    """The reference pipeline: PDFium renders each page at the page model's own working size (its
    image processor's pixels: a fixed height x width, or the longest edge squared), aspect kept."""
    import math

    import pypdfium2
    import transformers

    size = dict(transformers.AutoProcessor.from_pretrained(path).image_processor.size)
    pixels = size["height"] * size["width"] if "height" in size else size["longest_edge"] ** 2
    out = []
    pdf = pypdfium2.PdfDocument(document)
    for page in pdf:
        width, height = page.get_size()
        picture = page.render(scale=math.sqrt(pixels / (width * height))).to_pil().convert("RGB")
        buffer = io.BytesIO()
        picture.save(buffer, format="PNG")
        out.append(buffer.getvalue())
    pdf.close()
    return out


@pytest.mark.parametrize("model", ["colpali", "colmodernvbert"])
def test_a_pdf_is_embedded_page_by_page_as_its_rendered_pages(
    client: httpx.Client, models: dict[str, Path], data_dir: Path, model: str
) -> None:
    document = pdf_of(photo_variants(data_dir))
    parts: list[tuple[str, Any]] = [("file", ("q.png", image_bytes(30, 20), "image/png"))]
    parts.append(("file", ("doc.pdf", document, "application/pdf")))
    answer = client.post("/v1/embeddings/upload", data={"model": model, "output": "multivector"}, files=parts)
    assert answer.status_code == 200, answer.text
    entries = answer.json()["data"]
    assert [(e["index"], e.get("input"), e.get("page")) for e in entries] == [
        (0, None, None),
        (1, 1, 1),
        (2, 1, 2),
        (3, 1, 3),
    ]
    pages = rendered_pages(models[model], document)
    expected = multivectors(upload(client, model, [(f"{i}.png", p) for i, p in enumerate(pages)], output="multivector"))
    got = [np.asarray(e["embedding"], dtype=np.float32) for e in entries[1:]]
    for mine, theirs in zip(got, expected, strict=True):
        np.testing.assert_allclose(mine, theirs, atol=1e-5)


def test_pdf_pages_are_bounded_and_only_for_page_models(models: dict[str, Path], data_dir: Path) -> None:
    document = pdf_of(photo_variants(data_dir))
    pdf = [("file", ("doc.pdf", document, "application/pdf"))]
    chosen = {name: models[name] for name in ("colpali", "clip")}
    with media_server(chosen, max_pdf_pages=2) as live, live.client() as client:
        many = client.post("/v1/embeddings/upload", data={"model": "colpali", "output": "multivector"}, files=pdf)
        clip = client.post("/v1/embeddings/upload", data={"model": "clip"}, files=pdf)
        broken = [("file", ("bad.pdf", b"%PDF-1.7\nnot a document", "application/pdf"))]
        unreadable = client.post(
            "/v1/embeddings/upload", data={"model": "colpali", "output": "multivector"}, files=broken
        )
        health = client.get("/health")
    assert many.status_code == 400, many.text
    assert "3 pages" in many.json()["error"]["message"]
    assert "max_pdf_pages" in many.json()["error"]["message"]
    assert clip.status_code == 400, clip.text
    assert "page models" in clip.json()["error"]["message"]
    assert unreadable.status_code == 400, unreadable.text
    assert "cannot be read" in unreadable.json()["error"]["message"]
    assert health.status_code == 200


def test_a_pdf_by_data_uri_is_encoded_and_reranked_page_by_page(
    client: httpx.Client, models: dict[str, Path], data_dir: Path
) -> None:
    """The JSON routes take a PDF as a data URI (`application/pdf`) where they take images: `/v1/encode`
    answers each page, naming its input and page; image rerank ranks each page on its own, naming
    its document's index and its page, with the scores of the rendered pages sent as images."""
    document = pdf_of(photo_variants(data_dir))
    photo = data_uri(image_bytes(30, 20), "image/png")
    pdf = data_uri(document, "application/pdf")
    body = {"model": "colpali", "input": [photo, pdf], "modality": "image", "outputs": ["multivector"]}
    encoded = client.post("/v1/encode", json=body)
    assert encoded.status_code == 200, encoded.text
    rows = encoded.json()["data"]
    assert [(r["index"], r.get("input"), r.get("page")) for r in rows] == [
        (0, None, None),
        (1, 1, 1),
        (2, 1, 2),
        (3, 1, 3),
    ]
    pages = [data_uri(p, "image/png") for p in rendered_pages(models["colpali"], document)]
    alone = client.post("/v1/encode", json={**body, "input": pages}).json()["data"]
    for row, reference in zip(rows[1:], alone, strict=True):
        np.testing.assert_allclose(row["multivector"], reference["multivector"], atol=1e-5)
    query = "where are the cats?"
    ranked = client.post("/v1/rerank/images", json={"model": "colpali", "query": query, "documents": [photo, pdf]})
    assert ranked.status_code == 200, ranked.text
    by_page = {(r["index"], r.get("page")): r["relevance_score"] for r in ranked.json()["results"]}
    assert set(by_page) == {(0, None), (1, 1), (1, 2), (1, 3)}
    each = client.post("/v1/rerank/images", json={"model": "colpali", "query": query, "documents": pages}).json()
    for result in each["results"]:
        assert by_page[(1, result["index"] + 1)] == pytest.approx(result["relevance_score"], abs=1e-5)


@pytest.mark.parametrize("model", ["colqwen2.5", "colpali"])
def test_a_pages_visual_tokens_count_in_usage_as_its_processor_makes_them(
    client: httpx.Client, models: dict[str, Path], data_dir: Path, model: str
) -> None:
    from PIL import Image
    from transformers import AutoProcessor

    processor: Any = AutoProcessor.from_pretrained(str(models[model]))
    pages = photo_variants(data_dir)
    want = [
        int(processor.process_images([Image.open(io.BytesIO(p)).convert("RGB")])["attention_mask"].sum()) for p in pages
    ]
    got = []
    for page in pages:
        answer = upload(client, model, [("p.png", page)], output="multivector")
        assert answer.status_code == 200, answer.text
        got.append(answer.json()["usage"]["prompt_tokens"])
    assert got == want
    if model == "colqwen2.5":  # a dynamic-resolution model: pages of other sizes read other counts
        assert len(set(got)) > 1
