"""GME over HTTP on a tiny random model in the published layout, against the recipe of the model's
`gme_inference.py` written out here: the prompt written by hand (the instruction, else "You are a
helpful assistant.", as the system's turn; the image's vision tokens, the text, or both, the
image's first (a fused input), as the user's; the assistant's turn ended by `<|endoftext|>`),
images converted to RGB and resized twice (to multiples of 28 px between 4 and 16,384 tokens'
worth, then by the processor between 256 and 1,280 tokens), right padding, embeddings and vision
features put together by hand and the decoder called without position ids, the last real token's
hidden state, L2-normalised."""

from __future__ import annotations

import base64
import io
import math
import shutil
import warnings
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
from tests.builders.gme import tiny_gme
from tests.conftest import LiveServer, start_server

pytestmark = pytest.mark.integration

TEXTS = ["a cat sleeps on the warm windowsill", "two dogs run through the snow", "What is the capital?"]
QUERY = "Find an image that matches the given text"  # used as given: no full stop added
TOLERANCE = 1e-4


def picture(width: int, height: int, seed: int, mode: str = "RGB", spread: int = 256) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, spread, (height, width, len(mode)), dtype=np.uint8)
    if spread < 256:  # a gradient with a little noise: large, yet small to send
        pixels += (np.arange(width)[None, :, None] * 200 // width).astype(np.uint8)
    if mode == "RGBA":
        pixels[..., 3] = np.where(np.arange(width) < width // 2, 255, 40)[None, :].astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode=mode).save(buffer, format="PNG")
    return buffer.getvalue()


#: An ordinary size and a tiny one (both scaled up to 256 tokens), an RGBA one (its alpha dropped),
#: a wide one, and one past 1,280 tokens' worth (scaled down).
IMAGES = [
    picture(90, 50, 1),
    picture(20, 20, 2),
    picture(70, 60, 3, "RGBA"),
    picture(300, 40, 4),
    picture(1200, 1000, 5, spread=24),
]


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


# ---- the reference --------------------------------------------------------------------------------


def reference_size(height: int, width: int, least: int, most: int, factor: int = 28) -> tuple[int, int]:
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

    image: Any = Image.open(io.BytesIO(data)).convert("RGB")
    height, width = reference_size(image.height, image.width, 4 * 28 * 28, 16384 * 28 * 28)
    return image.resize((width, height))


def visual_tokens(data: bytes) -> int:
    """An image's visual tokens: its size after both resizes, in 28 x 28 px tokens."""
    first = reference_image(data)
    height, width = reference_size(first.height, first.width, 256 * 28 * 28, 1280 * 28 * 28)
    return (height // 28) * (width // 28)


def reference_prompt(given: dict[str, Any], text_first: bool = False) -> str:
    """An input's prompt as `GmeQwen2VL.embed` writes it: the image's tokens, then the text
    (`text_first`: the other way round, not the reference's order)."""
    text = given.get("text") or ""
    image = "" if given.get("image") is None else "<|vision_start|><|image_pad|><|vision_end|>"
    user = text + image if text_first else image + text
    system = given.get("instruction") or "You are a helpful assistant."
    return (
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
        "<|im_start|>assistant\n<|endoftext|>"
    )


class Reference:
    def __init__(self, root: Path) -> None:
        from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

        self.processor = AutoProcessor.from_pretrained(str(root), min_pixels=256 * 28 * 28, max_pixels=1280 * 28 * 28)
        self.processor.tokenizer.padding_side = "right"
        self.model = Qwen2VLForConditionalGeneration.from_pretrained(str(root)).eval()

    def embed(
        self, inputs: list[dict[str, Any]], max_length: int = 1800, text_first: bool = False
    ) -> tuple[np.ndarray, list[int]]:
        """Vectors and sequence lengths of `inputs` ({"text", "image", "instruction"}), in one batch;
        a text with an image is the reference's fused input (`text_first`: not its order)."""
        prompts = [reference_prompt(given, text_first) for given in inputs]
        images = [reference_image(given["image"]) for given in inputs if given.get("image") is not None]
        encoded = self.encode(prompts, images, max_length)
        ids, mask = encoded["input_ids"], encoded["attention_mask"]
        base = self.model.model
        with torch.no_grad():
            embeds = base.get_input_embeddings()(ids)
            if images:
                features = base.visual(encoded["pixel_values"], grid_thw=encoded["image_grid_thw"]).pooler_output
                embeds[ids == self.model.config.image_token_id] = features
            hidden = base(input_ids=None, attention_mask=mask, inputs_embeds=embeds).last_hidden_state
        if int(mask[:, -1].sum()) == mask.shape[0]:
            pooled = hidden[:, -1]
        else:
            pooled = hidden[torch.arange(hidden.shape[0]), mask.sum(dim=1) - 1]
        vectors = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return vectors.numpy(), [int(n) for n in mask.sum(dim=1)]

    def encode(self, prompts: list[str], images: list[Any], max_length: int) -> Any:
        with warnings.catch_warnings():  # transformers warns of `min_pixels` as the reference passes it
            warnings.simplefilter("ignore", FutureWarning)
            return self.processor(
                text=prompts,
                images=images or None,
                padding=True,
                truncation=True,
                max_length=max_length,
                return_tensors="pt",
            )

    def last_visual(self, given: dict[str, Any]) -> int:
        """The position of a fused input's last visual token in its sequence."""
        ids = self.encode([reference_prompt(given)], [reference_image(given["image"])], 1800)["input_ids"][0].numpy()
        return int(np.flatnonzero(ids == self.model.config.image_token_id)[-1])


# ---- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gme(tmp_path_factory.mktemp("gme") / "model")


@pytest.fixture(scope="module")
def reference(files: Path) -> Reference:
    return Reference(files)


@pytest.fixture(scope="module")
def server(files: Path) -> Iterator[LiveServer]:
    entry = {"name": "gme", "source": str(files), "prompts": {"query": QUERY}}
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


def images_body(images: list[bytes]) -> dict[str, Any]:
    return {"model": "gme", "input": [data_uri(i) for i in images], "modality": "image"}


# ---- tests --------------------------------------------------------------------------------------


def test_texts_match_the_reference_with_the_default_instruction(client: httpx.Client, reference: Reference) -> None:
    answer = client.post("/v1/embeddings", json={"model": "gme", "input": TEXTS})
    expected, lengths = reference.embed([{"text": t} for t in TEXTS])
    np.testing.assert_allclose(vectors(answer), expected, atol=TOLERANCE)
    assert answer.json()["usage"]["prompt_tokens"] == sum(lengths)


def test_a_named_prompt_is_the_instruction_as_given(client: httpx.Client, reference: Reference) -> None:
    answer = client.post("/v1/embeddings", json={"model": "gme", "input": TEXTS, "prompt_name": "query"})
    expected, _ = reference.embed([{"text": t, "instruction": QUERY} for t in TEXTS])
    np.testing.assert_allclose(vectors(answer), expected, atol=TOLERANCE)
    plain, _ = reference.embed([{"text": t} for t in TEXTS])
    stopped, _ = reference.embed([{"text": t, "instruction": QUERY + "."} for t in TEXTS])
    assert np.abs(expected - plain).max() > 1e-3  # the instruction changes the vectors
    assert np.abs(expected - stopped).max() > 1e-3  # and is used as given


def test_images_by_data_uri_match_the_reference(client: httpx.Client, reference: Reference) -> None:
    answer = client.post("/v1/embeddings", json=images_body(IMAGES))
    expected, lengths = reference.embed([{"image": i} for i in IMAGES])
    np.testing.assert_allclose(vectors(answer), expected, atol=TOLERANCE)
    # Visual tokens count in usage: each image is its whole sequence, known before the forward pass.
    assert answer.json()["usage"]["prompt_tokens"] == sum(lengths)
    visual = [visual_tokens(i) for i in IMAGES]
    assert len({n - v for n, v in zip(lengths, visual, strict=True)}) == 1  # the prompt's own tokens
    assert min(visual) >= 256
    assert max(visual) <= 1280
    assert visual[-1] > 1200  # scaled down to the bound
    assert visual[1] < 300  # scaled up to it


def test_an_image_with_a_query_instruction(client: httpx.Client, reference: Reference) -> None:
    answer = client.post("/v1/embeddings", json=images_body(IMAGES[:2]) | {"prompt_name": "query"})
    expected, _ = reference.embed([{"image": i, "instruction": QUERY} for i in IMAGES[:2]])
    np.testing.assert_allclose(vectors(answer), expected, atol=TOLERANCE)


def test_uploaded_images_and_texts_match_the_reference(client: httpx.Client, reference: Reference) -> None:
    files = [("file", (f"{i}.png", data, "image/png")) for i, data in enumerate(IMAGES[:2])]
    answer = client.post("/v1/embeddings/upload", data={"model": "gme", "input": TEXTS[0]}, files=files)
    # Form order: the text field first, then the files; texts and images share a batch.
    expected, lengths = reference.embed([{"text": TEXTS[0]}, *({"image": i} for i in IMAGES[:2])])
    np.testing.assert_allclose(vectors(answer), expected, atol=TOLERANCE)
    assert answer.json()["usage"]["prompt_tokens"] == sum(lengths)


def test_one_at_a_time_equals_batched(client: httpx.Client) -> None:
    texts = vectors(client.post("/v1/embeddings", json={"model": "gme", "input": TEXTS}))
    images = vectors(client.post("/v1/embeddings", json=images_body(IMAGES)))
    for i, text in enumerate(TEXTS):
        single = vectors(client.post("/v1/embeddings", json={"model": "gme", "input": [text]}))
        np.testing.assert_allclose(single[0], texts[i], atol=1e-5)
    for i, image in enumerate(IMAGES):
        np.testing.assert_allclose(
            vectors(client.post("/v1/embeddings", json=images_body([image])))[0], images[i], atol=1e-5
        )


def test_dimensions_cut_and_renormalise(client: httpx.Client, reference: Reference) -> None:
    answer = client.post("/v1/embeddings", json={"model": "gme", "input": TEXTS, "dimensions": 8})
    whole, _ = reference.embed([{"text": t} for t in TEXTS])
    cut = whole[:, :8] / np.linalg.norm(whole[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(vectors(answer), cut, atol=TOLERANCE)


def test_a_long_text_is_cut_as_the_reference_cuts_it(client: httpx.Client, reference: Reference) -> None:
    text = " ".join(TEXTS * 200)
    answer = client.post("/v1/embeddings", json={"model": "gme", "input": [text]})
    expected, lengths = reference.embed([{"text": text}])
    assert lengths == [1800]
    np.testing.assert_allclose(vectors(answer), expected, atol=TOLERANCE)
    refused = client.post("/v1/embeddings", json={"model": "gme", "input": [text], "truncate": False})
    assert refused.status_code == 400, refused.text


def test_the_model_says_what_it_takes(client: httpx.Client) -> None:
    listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert listed["gme"]["kind"] == "dense"
    assert {"embed_text", "embed_image"} <= set(listed["gme"]["capabilities"])
    refused = client.post("/v1/embeddings", json={"model": "gme", "input": [[1, 2, 3]]})
    assert refused.status_code == 400, refused.text


def test_qwen2_vl_files_without_the_reference_code_need_kind_dense(
    serve: Any, files: Path, tmp_path: Path, reference: Reference
) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(files, bare)
    (bare / "gme_inference.py").unlink()
    live = serve(
        {"models": [{"name": "chat", "source": str(bare)}, {"name": "bare", "source": str(bare), "kind": "dense"}]}
    )
    with live.client() as opened:
        refused = opened.post("/v1/embeddings", json={"model": "chat", "input": TEXTS})
        answer = opened.post("/v1/embeddings", json={"model": "bare", "input": TEXTS})
    assert refused.status_code == 503, refused.text
    message = refused.json()["error"]["message"]
    assert "Qwen2VLForConditionalGeneration" in message
    assert "`kind: dense`" in message
    expected, _ = reference.embed([{"text": t} for t in TEXTS])
    np.testing.assert_allclose(vectors(answer), expected, atol=TOLERANCE)


# ---- fused inputs: a text with an image -----------------------------------------------------------

#: A text with an image: an ordinary one, an RGBA one (its alpha dropped), a tiny one (scaled up).
FUSED: list[dict[str, Any]] = [
    {"text": TEXTS[0], "image": IMAGES[0]},
    {"text": TEXTS[1], "image": IMAGES[2]},
    {"text": TEXTS[2], "image": IMAGES[1]},
]


def as_object(given: dict[str, Any]) -> dict[str, str]:
    """A reference input as `/v1/embeddings`' input object: the image as a data URI."""
    return {k: data_uri(v) if k == "image" else v for k, v in given.items()}


def test_fused_inputs_match_the_reference_batched_with_texts_and_images(
    client: httpx.Client, reference: Reference
) -> None:
    """A text and an image in one input object: one user turn, the image's tokens first, then the
    text, as `GmeQwen2VL.get_fused_embeddings` writes it; in one batch with a text and an image."""
    given: list[dict[str, Any]] = [*FUSED, {"text": TEXTS[0]}, {"image": IMAGES[3]}]
    body = {"model": "gme", "input": [*(as_object(g) for g in FUSED), TEXTS[0], {"image": data_uri(IMAGES[3])}]}
    answer = client.post("/v1/embeddings", json=body)
    expected, lengths = reference.embed(given)
    got = vectors(answer)
    np.testing.assert_allclose(got, expected, atol=TOLERANCE)
    print(f"fused inputs: largest difference from the reference {np.abs(got - expected).max():.2e}")
    # Usage counts each input's whole sequence: its prompt's and text's tokens and the image's visual tokens.
    assert answer.json()["usage"]["prompt_tokens"] == sum(lengths)
    _, pictured = reference.embed([{"image": g["image"]} for g in FUSED])
    for fused, picture_only, g in zip(lengths[: len(FUSED)], pictured, FUSED, strict=True):
        assert picture_only > visual_tokens(g["image"]) >= 256
        text_tokens = len(reference.processor.tokenizer(g["text"], add_special_tokens=False)["input_ids"])
        assert fused == picture_only + text_tokens  # every visual token, and the text's
    alone = [reference.embed([{"text": g["text"]}])[0][0] for g in FUSED]
    pictures = [reference.embed([{"image": g["image"]}])[0][0] for g in FUSED]
    assert all(np.abs(got[i] - alone[i]).max() > 1e-3 for i in range(len(FUSED)))  # neither part alone
    assert all(np.abs(got[i] - pictures[i]).max() > 1e-3 for i in range(len(FUSED)))


def test_a_fused_input_reads_the_image_before_the_text(client: httpx.Client, reference: Reference) -> None:
    """The order is the reference's: the text first would be another vector."""
    answer = vectors(client.post("/v1/embeddings", json={"model": "gme", "input": [as_object(FUSED[0])]}))
    text_first, _ = reference.embed([FUSED[0]], text_first=True)
    assert np.abs(answer[0] - text_first[0]).max() > 1e-3


def test_fused_inputs_take_the_instruction(client: httpx.Client, reference: Reference) -> None:
    body = {"model": "gme", "input": [as_object(g) for g in FUSED], "prompt_name": "query"}
    got = vectors(client.post("/v1/embeddings", json=body))
    expected, _ = reference.embed([{**g, "instruction": QUERY} for g in FUSED])
    np.testing.assert_allclose(got, expected, atol=TOLERANCE)
    plain, _ = reference.embed(FUSED)
    assert np.abs(expected - plain).max() > 1e-3  # the instruction changes the vectors


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
    body = {"model": "gme", "inputs": inputs, "input_type": "search_query", "embedding_types": ["float"]}
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


def test_fused_inputs_one_at_a_time_equal_batched(client: httpx.Client) -> None:
    body = {"model": "gme", "input": [TEXTS[1], *(as_object(g) for g in FUSED), {"image": data_uri(IMAGES[0])}]}
    batched = vectors(client.post("/v1/embeddings", json=body))
    for i, one in enumerate(body["input"]):
        single = vectors(client.post("/v1/embeddings", json={"model": "gme", "input": [one]}))
        np.testing.assert_allclose(single[0], batched[i], atol=1e-5)


def test_an_over_long_fused_input_loses_its_text_end_never_its_image(
    serve: Any, files: Path, reference: Reference
) -> None:
    """Cut at its end as the reference's processor cuts it while every visual token stays; a cut
    into the image, or no cut allowed, is a 400."""
    _, (length,) = reference.embed([FUSED[0]])
    limit = length - 4  # the prompt's closing tokens go; the text and the image stay
    live = serve({"models": [{"name": "short", "source": str(files), "max_length": limit}]})
    with live.client() as opened:
        answer = opened.post("/v1/embeddings", json={"model": "short", "input": [as_object(FUSED[0])]})
        expected, lengths = reference.embed([FUSED[0]], max_length=limit)
        np.testing.assert_allclose(vectors(answer), expected, atol=TOLERANCE)
        assert answer.json()["usage"]["prompt_tokens"] == lengths[0] == limit
        whole = {"model": "short", "input": [as_object(FUSED[0])], "truncate": False}
        assert opened.post("/v1/embeddings", json=whole).status_code == 400
    live = serve({"models": [{"name": "shorter", "source": str(files), "max_length": reference.last_visual(FUSED[0])}]})
    with live.client() as opened:  # the last visual token would be the first one cut
        refused = opened.post("/v1/embeddings", json={"model": "shorter", "input": [as_object(FUSED[0])]})
    assert refused.status_code == 400, refused.text
    assert "the text and the image's" in refused.json()["error"]["message"]


def test_the_result_cache_keys_a_fused_input_by_both_parts(serve: Any, files: Path) -> None:
    live = serve({"models": [{"name": "cached", "source": str(files), "cache": {"bytes": "1MiB"}}]})
    first = {"model": "cached", "input": [as_object(FUSED[0])]}
    others = [{"text": TEXTS[0], "image": data_uri(IMAGES[1])}, {"text": TEXTS[1], "image": data_uri(IMAGES[0])}]
    with live.client() as opened:
        computed = opened.post("/v1/embeddings", json=first)
        # The same text with another image, the same image with another text, each part alone: all new.
        parts = [*others, TEXTS[0], {"image": data_uri(IMAGES[0])}]
        changed = opened.post("/v1/embeddings", json={"model": "cached", "input": parts})
        found = opened.post("/v1/embeddings", json=first)
    assert (computed.headers["x-cache"], changed.headers["x-cache"], found.headers["x-cache"]) == (
        "miss",
        "miss",
        "hit",
    )
    np.testing.assert_array_equal(vectors(found), vectors(computed))


def test_image_rerank_ranks_a_fused_document_by_its_fused_vector(client: httpx.Client) -> None:
    documents = [as_object(FUSED[0]), data_uri(IMAGES[3])]
    ranked = client.post("/v1/rerank/images", json={"model": "gme", "query": TEXTS[2], "documents": documents})
    assert ranked.status_code == 200, ranked.text
    scores = {r["index"]: r["relevance_score"] for r in ranked.json()["results"]}
    query = vectors(client.post("/v1/embeddings", json={"model": "gme", "input": [TEXTS[2]]}))[0]
    embedded = vectors(
        client.post("/v1/embeddings", json={"model": "gme", "input": [documents[0], {"image": documents[1]}]})
    )
    np.testing.assert_allclose([scores[0], scores[1]], embedded @ query, atol=1e-5)
