"""Qwen3-VL-Embedding over HTTP on a tiny random model in the published layout, against the
reference code's recipe written out here: a system message with the instruction (a full stop
added where it ends in no punctuation), the image or the text as the user's message, the chat
template with the assistant's turn opened, images laid over white and resized to multiples of 32
px between 4 and 1,800 tokens' worth, right padding, the last real token's hidden state of
transformers' `Qwen3VLModel`, L2-normalised."""

from __future__ import annotations

import base64
import io
import math
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from infinity_server.app import create_app
from infinity_server.settings import ServerSettings, Settings
from model_registry.config import registry_config
from tests.builders.qwen3_vl import tiny_qwen3_vl_embedding
from tests.conftest import LiveServer, start_server

pytestmark = pytest.mark.integration

TEXTS = ["a cat sleeps on the warm windowsill", "two dogs run through the snow", "What is the capital?"]
QUERY = "Find the picture that shows the animal"  # no final punctuation: the reference adds "."
TOLERANCE = 1e-4


def picture(width: int, height: int, seed: int, mode: str = "RGB") -> bytes:
    from PIL import Image

    channels = len(mode)
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)
    if mode == "RGBA":
        pixels[..., 3] = np.where(np.arange(width) < width // 2, 255, 40)[None, :].astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode=mode).save(buffer, format="PNG")
    return buffer.getvalue()


#: An ordinary size, one under min_pixels (scaled up), an RGBA one (laid over white), a wide one.
IMAGES = [picture(90, 50, 1), picture(20, 20, 2), picture(70, 60, 3, "RGBA"), picture(300, 40, 4)]


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


# ---- the reference --------------------------------------------------------------------------------


def reference_instruction(text: str | None) -> str:
    text = (text or "").strip()
    if text and not unicodedata.category(text[-1]).startswith("P"):
        text += "."
    return text or "Represent the user's input."


def reference_size(height: int, width: int, factor: int = 32) -> tuple[int, int]:
    least, most = 4 * factor * factor, 1800 * factor * factor
    h, w = max(factor, round(height / factor) * factor), max(factor, round(width / factor) * factor)
    if h * w > most:
        beta = math.sqrt(height * width / most)
        h, w = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    elif h * w < least:
        beta = math.sqrt(least / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def reference_image(data: bytes) -> Any:
    from PIL import Image

    image: Any = Image.open(io.BytesIO(data))
    if image.mode == "RGBA":
        white = Image.new("RGB", image.size, (255, 255, 255))
        white.paste(image, mask=image.split()[3])
        image = white
    else:
        image = image.convert("RGB")
    height, width = reference_size(image.height, image.width)
    return image.resize((width, height))


class Reference:
    def __init__(self, root: Path) -> None:
        from transformers import AutoProcessor, Qwen3VLForConditionalGeneration

        self.processor = AutoProcessor.from_pretrained(str(root), padding_side="right")
        self.model = Qwen3VLForConditionalGeneration.from_pretrained(str(root)).eval()

    def embed(self, inputs: list[dict[str, Any]], max_length: int = 8192) -> tuple[np.ndarray, list[int]]:
        """Vectors and sequence lengths of `inputs` ({"text", "image", "instruction"}), in one batch."""
        conversations, images = [], []
        for given in inputs:
            content: list[dict[str, Any]] = []
            if given.get("image") is not None:
                image = reference_image(given["image"])
                images.append(image)
                content.append({"type": "image", "image": image})
            if given.get("text") is not None:
                content.append({"type": "text", "text": given["text"]})
            system = {
                "role": "system",
                "content": [{"type": "text", "text": reference_instruction(given.get("instruction"))}],
            }
            conversations.append([system, {"role": "user", "content": content}])
        text = self.processor.apply_chat_template(conversations, add_generation_prompt=True, tokenize=False)
        encoded = self.processor(
            text=text,
            images=images or None,
            truncation=True,
            max_length=max_length,
            padding=True,
            do_resize=False,
            return_tensors="pt",
        )
        with torch.no_grad():
            hidden = self.model.model(**encoded).last_hidden_state
        mask = encoded["attention_mask"]
        last = mask.shape[1] - mask.flip(dims=[1]).argmax(dim=1) - 1
        pooled = hidden[torch.arange(hidden.shape[0]), last]
        vectors = torch.nn.functional.normalize(pooled, p=2, dim=-1)
        return vectors.numpy(), [int(n) for n in mask.sum(dim=1)]

    def last_visual(self, given: dict[str, Any]) -> int:
        """The position of a mixed input's last visual token in its sequence."""
        image = reference_image(given["image"])
        content = [{"type": "image", "image": image}, {"type": "text", "text": given["text"]}]
        system = {"role": "system", "content": [{"type": "text", "text": reference_instruction(None)}]}
        text = self.processor.apply_chat_template(
            [[system, {"role": "user", "content": content}]], add_generation_prompt=True, tokenize=False
        )
        ids = self.processor(text=text, images=[image], do_resize=False, return_tensors="np")["input_ids"][0]
        return int(np.flatnonzero(ids == self.processor.image_token_id)[-1])

    def embed_text_first(self, given: dict[str, Any]) -> np.ndarray:
        """A mixed input with its text before its image: not the reference's order."""
        image = reference_image(given["image"])
        content = [{"type": "text", "text": given["text"]}, {"type": "image", "image": image}]
        system = {"role": "system", "content": [{"type": "text", "text": reference_instruction(None)}]}
        text = self.processor.apply_chat_template(
            [[system, {"role": "user", "content": content}]], add_generation_prompt=True, tokenize=False
        )
        encoded = self.processor(text=text, images=[image], do_resize=False, return_tensors="pt")
        with torch.no_grad():
            hidden = self.model.model(**encoded).last_hidden_state
        vector: np.ndarray = torch.nn.functional.normalize(hidden[0, -1], p=2, dim=-1).numpy()
        return vector


# ---- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_qwen3_vl_embedding(tmp_path_factory.mktemp("qwen3vl") / "model", prompts={"query": QUERY})


@pytest.fixture(scope="module")
def reference(files: Path) -> Reference:
    return Reference(files)


@pytest.fixture(scope="module")
def server(files: Path) -> Iterator[LiveServer]:
    entry = {"name": "vl", "source": str(files)}
    live = start_server(create_app(Settings(ServerSettings(access_log=False), registry_config({"models": [entry]}))))
    yield live
    live.close()


@pytest.fixture
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as opened:
        yield opened


def vectors(answer: httpx.Response) -> np.ndarray:
    assert answer.status_code == 200, answer.text
    return np.array([row["embedding"] for row in answer.json()["data"]], dtype=np.float32)


# ---- tests --------------------------------------------------------------------------------------


def test_texts_match_the_reference_with_the_default_instruction(client: httpx.Client, reference: Reference) -> None:
    answer = client.post("/v1/embeddings", json={"model": "vl", "input": TEXTS})
    expected, lengths = reference.embed([{"text": t} for t in TEXTS])
    np.testing.assert_allclose(vectors(answer), expected, atol=TOLERANCE)
    assert answer.json()["usage"]["prompt_tokens"] == sum(lengths)


def test_a_named_prompt_is_the_instruction(client: httpx.Client, reference: Reference) -> None:
    answer = client.post("/v1/embeddings", json={"model": "vl", "input": TEXTS, "prompt_name": "query"})
    expected, _ = reference.embed([{"text": t, "instruction": QUERY} for t in TEXTS])
    np.testing.assert_allclose(vectors(answer), expected, atol=TOLERANCE)
    plain, _ = reference.embed([{"text": t} for t in TEXTS])
    assert np.abs(expected - plain).max() > 1e-3  # the instruction changes the vectors


def test_images_by_data_uri_match_the_reference(client: httpx.Client, reference: Reference) -> None:
    body = {"model": "vl", "input": [data_uri(i) for i in IMAGES], "modality": "image"}
    answer = client.post("/v1/embeddings", json=body)
    expected, lengths = reference.embed([{"image": i} for i in IMAGES])
    np.testing.assert_allclose(vectors(answer), expected, atol=TOLERANCE)
    # Visual tokens count in usage: each image is its whole sequence, known before the forward pass.
    assert answer.json()["usage"]["prompt_tokens"] == sum(lengths)


def test_uploaded_images_and_texts_match_the_reference(client: httpx.Client, reference: Reference) -> None:
    files = [("file", (f"{i}.png", data, "image/png")) for i, data in enumerate(IMAGES[:2])]
    answer = client.post("/v1/embeddings/upload", data={"model": "vl", "input": TEXTS[0]}, files=files)
    # Form order: the text field first, then the files; texts and images share a batch.
    expected, lengths = reference.embed([{"text": TEXTS[0]}, *({"image": i} for i in IMAGES[:2])])
    np.testing.assert_allclose(vectors(answer), expected, atol=TOLERANCE)
    assert answer.json()["usage"]["prompt_tokens"] == sum(lengths)


def test_one_at_a_time_equals_batched(client: httpx.Client) -> None:
    texts = vectors(client.post("/v1/embeddings", json={"model": "vl", "input": TEXTS}))
    images = vectors(
        client.post("/v1/embeddings", json={"model": "vl", "input": [data_uri(i) for i in IMAGES], "modality": "image"})
    )
    for i, text in enumerate(TEXTS):
        single = vectors(client.post("/v1/embeddings", json={"model": "vl", "input": [text]}))
        np.testing.assert_allclose(single[0], texts[i], atol=1e-5)
    for i, image in enumerate(IMAGES):
        body = {"model": "vl", "input": [data_uri(image)], "modality": "image"}
        np.testing.assert_allclose(vectors(client.post("/v1/embeddings", json=body))[0], images[i], atol=1e-5)


def test_dimensions_cut_and_renormalise(client: httpx.Client, reference: Reference) -> None:
    answer = client.post("/v1/embeddings", json={"model": "vl", "input": TEXTS, "dimensions": 8})
    whole, _ = reference.embed([{"text": t} for t in TEXTS])
    cut = whole[:, :8] / np.linalg.norm(whole[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(vectors(answer), cut, atol=TOLERANCE)


#: Mixed inputs: a text with an image (one under min_pixels, one with alpha among them).
MIXED: list[dict[str, Any]] = [
    {"text": TEXTS[0], "image": IMAGES[0]},
    {"text": TEXTS[1], "image": IMAGES[2]},
    {"text": TEXTS[2], "image": IMAGES[1]},
]


def as_object(given: dict[str, Any]) -> dict[str, str]:
    """A reference input as `/v1/embeddings`' input object: the image as a data URI."""
    return {k: data_uri(v) if k == "image" else v for k, v in given.items()}


def test_mixed_inputs_match_the_reference_batched_with_texts_and_images(
    client: httpx.Client, reference: Reference
) -> None:
    """A text and an image in one input object: one user message, the image first, then the text,
    as `Qwen3VLEmbedder.format_model_input` builds it; in one batch with a text and an image."""
    given: list[dict[str, Any]] = [*MIXED, {"text": TEXTS[0]}, {"image": IMAGES[3]}]
    body = {"model": "vl", "input": [*(as_object(g) for g in MIXED), TEXTS[0], {"image": data_uri(IMAGES[3])}]}
    answer = client.post("/v1/embeddings", json=body)
    expected, lengths = reference.embed(given)
    got = vectors(answer)
    np.testing.assert_allclose(got, expected, atol=TOLERANCE)
    print(f"mixed inputs: largest difference from the reference {np.abs(got - expected).max():.2e}")
    # Usage counts each input's whole sequence: the text's tokens and the image's visual tokens.
    assert answer.json()["usage"]["prompt_tokens"] == sum(lengths)
    alone = [reference.embed([{"text": g["text"]}])[0][0] for g in MIXED]
    pictures = [reference.embed([{"image": g["image"]}])[0][0] for g in MIXED]
    assert all(np.abs(got[i] - alone[i]).max() > 1e-3 for i in range(len(MIXED)))  # neither part alone
    assert all(np.abs(got[i] - pictures[i]).max() > 1e-3 for i in range(len(MIXED)))


def test_a_mixed_input_reads_the_image_before_the_text(client: httpx.Client, reference: Reference) -> None:
    """The order is the reference's: the text first would be another vector."""
    answer = vectors(client.post("/v1/embeddings", json={"model": "vl", "input": [as_object(MIXED[0])]}))
    text_first = reference.embed_text_first(MIXED[0])
    assert np.abs(answer[0] - text_first).max() > 1e-3


def test_mixed_inputs_take_the_instruction(client: httpx.Client, reference: Reference) -> None:
    body = {"model": "vl", "input": [as_object(g) for g in MIXED], "prompt_name": "query"}
    expected, _ = reference.embed([{**g, "instruction": QUERY} for g in MIXED])
    np.testing.assert_allclose(vectors(client.post("/v1/embeddings", json=body)), expected, atol=TOLERANCE)


def test_cohere_v2_inputs_with_a_text_and_an_image_match_the_reference(
    client: httpx.Client, reference: Reference
) -> None:
    """Cohere v2's content list: text parts (joined by newlines) and one image part are one input."""
    inputs = [
        {
            "content": [
                {"type": "text", "text": "a cat"},
                {"type": "image_url", "image_url": {"url": data_uri(IMAGES[0])}},
                {"type": "text", "text": "on a windowsill"},
            ]
        },
        {"content": [{"type": "text", "text": TEXTS[1]}]},
        {"content": [{"type": "image_url", "image_url": {"url": data_uri(IMAGES[1])}}]},
    ]
    body = {"model": "vl", "inputs": inputs, "input_type": "search_query", "embedding_types": ["float"]}
    answer = client.post("/v2/embed", json=body)
    assert answer.status_code == 200, answer.text
    given: list[dict[str, Any]] = [
        {"text": "a cat\non a windowsill", "image": IMAGES[0]},
        {"text": TEXTS[1]},
        {"image": IMAGES[1]},
    ]
    expected, lengths = reference.embed([{**g, "instruction": QUERY} for g in given])
    got = np.array(answer.json()["embeddings"]["float"], dtype=np.float32)
    np.testing.assert_allclose(got, expected, atol=TOLERANCE)
    assert answer.json()["meta"]["billed_units"]["input_tokens"] == sum(lengths)
    assert answer.json()["texts"] == ["a cat\non a windowsill", TEXTS[1]]
    two = {"content": [{"type": "image_url", "image_url": {"url": data_uri(i)}} for i in IMAGES[:2]]}
    refused = client.post("/v2/embed", json={"model": "vl", "inputs": [two]})
    assert refused.status_code == 400, refused.text
    assert "at most one image" in refused.json()["error"]["message"]


def test_mixed_inputs_one_at_a_time_equal_batched(client: httpx.Client) -> None:
    body = {"model": "vl", "input": [TEXTS[1], *(as_object(g) for g in MIXED), {"image": data_uri(IMAGES[0])}]}
    batched = vectors(client.post("/v1/embeddings", json=body))
    for i, one in enumerate(body["input"]):
        single = vectors(client.post("/v1/embeddings", json={"model": "vl", "input": [one]}))
        np.testing.assert_allclose(single[0], batched[i], atol=1e-5)


def test_an_over_long_mixed_input_loses_its_text_end_never_its_image(
    serve: Any, files: Path, reference: Reference
) -> None:
    """Cut at its end as the reference's processor cuts it while every visual token stays; a cut
    into the image, or no cut allowed, is a 400."""
    _, (length,) = reference.embed([MIXED[0]])
    limit = length - 4  # the assistant's opening and the last text token go
    live = serve({"models": [{"name": "short", "source": str(files), "max_length": limit}]})
    with live.client() as opened:
        answer = opened.post("/v1/embeddings", json={"model": "short", "input": [as_object(MIXED[0])]})
        expected, lengths = reference.embed([MIXED[0]], max_length=limit)
        np.testing.assert_allclose(vectors(answer), expected, atol=TOLERANCE)
        assert answer.json()["usage"]["prompt_tokens"] == lengths[0] == limit
        whole = {"model": "short", "input": [as_object(MIXED[0])], "truncate": False}
        assert opened.post("/v1/embeddings", json=whole).status_code == 400
    live = serve({"models": [{"name": "shorter", "source": str(files), "max_length": reference.last_visual(MIXED[0])}]})
    with live.client() as opened:  # the last visual token would be the first one cut
        refused = opened.post("/v1/embeddings", json={"model": "shorter", "input": [as_object(MIXED[0])]})
    assert refused.status_code == 400, refused.text
    assert "the text and the image's" in refused.json()["error"]["message"]


def test_image_rerank_ranks_a_mixed_document_by_its_mixed_vector(client: httpx.Client) -> None:
    documents = [as_object(MIXED[0]), data_uri(IMAGES[3])]
    ranked = client.post("/v1/rerank/images", json={"model": "vl", "query": TEXTS[2], "documents": documents})
    assert ranked.status_code == 200, ranked.text
    scores = {r["index"]: r["relevance_score"] for r in ranked.json()["results"]}
    query = vectors(client.post("/v1/embeddings", json={"model": "vl", "input": [TEXTS[2]]}))[0]
    embedded = vectors(
        client.post("/v1/embeddings", json={"model": "vl", "input": [documents[0], {"image": documents[1]}]})
    )
    np.testing.assert_allclose([scores[0], scores[1]], embedded @ query, atol=1e-5)


def test_bad_input_objects_are_refused(client: httpx.Client) -> None:
    cases = [
        {"model": "vl", "input": [{}]},
        {"model": "vl", "input": [{"text": "", "image": data_uri(IMAGES[0])}]},
        {"model": "vl", "input": [{"text": "a", "image": data_uri(IMAGES[0])}], "modality": "image"},
        {"model": "vl", "input": [{"text": "a", "image": "data:image/png;base64,bm90IGFuIGltYWdl"}]},
    ]
    for body in cases:
        answer = client.post("/v1/embeddings", json=body)
        assert answer.status_code == 400, (body, answer.text)


def test_the_model_says_what_it_takes(client: httpx.Client) -> None:
    listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert {"embed_text", "embed_image"} <= set(listed["vl"]["capabilities"])
    refused = client.post("/v1/embeddings", json={"model": "vl", "input": [[1, 2, 3]]})
    assert refused.status_code == 400, refused.text


def test_kind_dense_serves_the_files_without_sentence_transformers_modules(
    serve: Any, files: Path, tmp_path: Path, reference: Reference
) -> None:
    """A checkpoint as first published, before its sentence-transformers files: `kind: dense`."""
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(files, bare)
    for name in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"):
        (bare / name).unlink()
    shutil.rmtree(bare / "1_Pooling")
    shutil.rmtree(bare / "3_Normalize", ignore_errors=True)
    live = serve({"models": [{"name": "bare", "source": str(bare), "kind": "dense"}]})
    with live.client() as opened:
        answer = opened.post("/v1/embeddings", json={"model": "bare", "input": TEXTS})
    expected, _ = reference.embed([{"text": t} for t in TEXTS])
    np.testing.assert_allclose(vectors(answer), expected, atol=TOLERANCE)


def test_the_model_lists_images_before_it_loads(serve: Any, files: Path) -> None:
    live = serve({"models": [{"name": "cold", "source": str(files)}]})
    with live.client() as opened:
        listed = {m["id"]: m for m in opened.get("/v1/models").json()["data"]}
    assert listed["cold"]["kind"] == "dense"
    assert {"embed_text", "embed_image"} <= set(listed["cold"]["capabilities"])
