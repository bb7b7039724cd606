"""SigLIP 2 over HTTP, both variants, against transformers on the same weights: the processor's
output fed to `get_text_features` / `get_image_features`, as the model card does.

Fixed resolution: a SiglipModel with a Gemma tokenizer, texts padded to 64 with the tokenizer's
mask. NaFlex: a Siglip2Model whose processor resizes each image at its own aspect ratio to at most
`max_num_patches` patches. Images by data URI, URL and upload; batched equals single.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from tests.builders.media import image_bytes, tiny_siglip2, tiny_siglip2_naflex
from tests.conftest import LiveServer
from tests.integration.media_setup import data_uri, media_server
from tests.media_http import file_server

pytestmark = pytest.mark.integration

TOL = 1e-4
PHOTO = "cats_coco_sample.jpg"
TEXTS = [
    "two cats on a sofa",
    "A Plane Is Taking Off",
    " ".join(["the cat sleeps on the warm windowsill"] * 4),  # longer than 64 tokens: cut
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("siglip2")
    return {"fixed": tiny_siglip2(root / "fixed"), "naflex": tiny_siglip2_naflex(root / "naflex")}


@pytest.fixture(scope="module")
def client(models: dict[str, Path]) -> Iterator[httpx.Client]:
    # JPEGs decoded whole, as the references do (reduced decoding: tests/unit/test_scaled_jpeg.py).
    with media_server(models, {"scaled_jpeg": False}, media_allowed_hosts=("127.0.0.1",)) as live, live.client() as c:
        yield c


@pytest.fixture(scope="module")
def files(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("served")
    for name, data in images(data_dir).items():
        (root / name).write_bytes(data)
    with file_server(root) as (base, _):
        yield base, root


def images(data_dir: Path) -> dict[str, bytes]:
    """The real photo, and random images wide, tall and tiny: their patch grids all differ."""
    return {
        "photo.jpg": (data_dir / PHOTO).read_bytes(),
        "wide.png": image_bytes(120, 24, seed=1),
        "tall.png": image_bytes(20, 70, seed=2),
        "tiny.png": image_bytes(9, 5, seed=3),
    }


def vectors(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)


def embed(client: httpx.Client, model: str, inputs: list[str], modality: str = "text") -> np.ndarray:
    return vectors(client.post("/v1/embeddings", json={"model": model, "input": inputs, "modality": modality}))


def reference(directory: Path, *, texts: Sequence[str] = (), pictures: Sequence[bytes] = ()) -> np.ndarray:
    """transformers: the checkpoint's tokenizer and image processor as the model card calls them, then
    the features, one input at a time. (`Siglip2Processor` itself would impose its class defaults,
    256 patches of 16 px, which the published checkpoints share but these tiny ones do not.)"""
    from PIL import Image
    from transformers import AutoModel, AutoProcessor

    model = AutoModel.from_pretrained(directory).eval()
    processor = AutoProcessor.from_pretrained(directory)
    out = []
    with torch.inference_mode():
        for text in texts:
            inputs = processor(text=[text], padding="max_length", max_length=64, truncation=True, return_tensors="pt")
            out.append(model.get_text_features(**inputs).pooler_output[0].numpy())
        for picture in pictures:
            image = Image.open(io.BytesIO(picture)).convert("RGB")
            inputs = processor.image_processor(images=[image], return_tensors="pt")
            out.append(model.get_image_features(**inputs).pooler_output[0].numpy())
    return np.stack(out)


@pytest.mark.parametrize("variant", ["fixed", "naflex"])
def test_text_matches_the_processor_and_get_text_features(
    client: httpx.Client, models: dict[str, Path], variant: str
) -> None:
    got = embed(client, variant, TEXTS)
    single = np.concatenate([embed(client, variant, [t]) for t in TEXTS])
    np.testing.assert_allclose(got, reference(models[variant], texts=TEXTS), atol=TOL)
    np.testing.assert_allclose(single, got, atol=1e-5)


@pytest.mark.parametrize("variant", ["fixed", "naflex"])
def test_images_match_get_image_features(
    client: httpx.Client, models: dict[str, Path], data_dir: Path, variant: str
) -> None:
    pictures = list(images(data_dir).values())
    got = embed(client, variant, [data_uri(p, "image/png") for p in pictures], "image")
    single = np.concatenate([embed(client, variant, [data_uri(p, "image/png")], "image") for p in pictures])
    np.testing.assert_allclose(got, reference(models[variant], pictures=pictures), atol=TOL)
    np.testing.assert_allclose(single, got, atol=1e-5)
    assert not np.allclose(got[1], got[2])


def test_naflex_images_by_url_and_upload_equal_data_uris(
    client: httpx.Client, files: tuple[str, Path], data_dir: Path
) -> None:
    base, root = files
    names = sorted(images(data_dir))
    by_uri = embed(client, "naflex", [data_uri((root / n).read_bytes(), "image/png") for n in names], "image")
    by_url = embed(client, "naflex", [f"{base}/{n}" for n in names], "image")
    parts = [("file", (n, (root / n).read_bytes(), "image/png")) for n in names]
    by_upload = vectors(client.post("/v1/embeddings/upload", data={"model": "naflex"}, files=parts))
    np.testing.assert_allclose(by_url, by_uri, atol=1e-6)
    np.testing.assert_allclose(by_upload, by_uri, atol=1e-6)


def test_naflex_rerank_and_models_page(client: httpx.Client, data_dir: Path) -> None:
    pictures = [data_uri(p, "image/png") for p in images(data_dir).values()]
    ranked = client.post("/v1/rerank/images", json={"model": "naflex", "query": "two cats", "documents": pictures})
    texts = embed(client, "naflex", ["two cats"])
    pics = embed(client, "naflex", pictures, "image")
    listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert ranked.status_code == 200, ranked.text
    cosine = (pics @ texts[0]) / (np.linalg.norm(pics, axis=1) * np.linalg.norm(texts[0]))
    scores = {r["index"]: r["relevance_score"] for r in ranked.json()["results"]}
    np.testing.assert_allclose([scores[i] for i in range(len(pictures))], cosine, atol=1e-5)
    assert listed["naflex"]["kind"] == "image_text"
    assert set(listed["naflex"]["capabilities"]) == {"embed_text", "embed_image"}
    assert listed["naflex"]["details"]["max_num_patches"] == 24


def test_naflex_prices_an_image_by_its_patches(models: dict[str, Path], data_dir: Path) -> None:
    """An image costs the patches the processor keeps for it, never more than `max_num_patches`."""
    from PIL import Image
    from transformers import AutoImageProcessor

    from model_registry.adapters import LoadOptions, create_adapter
    from model_registry.config import ModelSpec
    from model_registry.types import EmbedItem, Media, Modality, Output

    processor = AutoImageProcessor.from_pretrained(models["naflex"])
    pictures = list(images(data_dir).values())
    for entry_options, limit in (({}, 24), ({"max_num_patches": 8}, 8)):
        adapter = create_adapter(ModelSpec(name="n", source=str(models["naflex"]), options=entry_options))
        adapter.load(LoadOptions(device="cpu", dtype="float32", max_batch_tokens=1024))
        items = [EmbedItem(Media(Modality.IMAGE, p), frozenset({Output.DENSE})) for p in pictures]
        costs = [p.cost for p in adapter.prepare(items)]
        opened = [Image.open(io.BytesIO(p)).convert("RGB") for p in pictures]
        masks = [
            processor(images=[i], max_num_patches=limit, return_tensors="pt")["pixel_attention_mask"] for i in opened
        ]
        assert costs == [int(m.sum()) for m in masks]
        assert max(costs) <= limit < sum(costs)
        assert adapter.describe()["max_num_patches"] == limit


def test_naflex_refuses_a_bad_max_num_patches(serve: Any, models: dict[str, Path]) -> None:
    server: LiveServer = serve(
        {"models": [{"name": "n", "source": str(models["naflex"]), "options": {"max_num_patches": 0}}]}
    )
    with server.client() as c:
        response = c.post("/v1/embeddings", json={"model": "n", "input": ["a"]})
        health = c.get("/health")
    assert response.status_code == 503, response.text
    assert "max_num_patches" in response.json()["error"]["message"]
    assert health.status_code == 200


def test_naflex_images_count_their_patches_in_usage_and_fixed_size_ones_do_not(
    client: httpx.Client, models: dict[str, Path], data_dir: Path
) -> None:
    from PIL import Image
    from transformers import AutoProcessor

    processor: Any = AutoProcessor.from_pretrained(models["naflex"])
    pictures = images(data_dir)
    for name, picture in pictures.items():
        image = Image.open(io.BytesIO(picture)).convert("RGB")
        patches = int(processor.image_processor(images=[image], return_tensors="pt")["pixel_attention_mask"].sum())
        uri = data_uri(picture, "image/png" if name.endswith(".png") else "image/jpeg")
        for model, want in (("naflex", patches), ("fixed", 0)):
            answer = client.post("/v1/embeddings", json={"model": model, "input": [uri], "modality": "image"})
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["prompt_tokens"] == want, (model, name)
