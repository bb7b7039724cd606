"""Cohere's embed (v1 and v2) with the `cohere` client against a real server, compared with /v1/embeddings."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.builders.media import image_bytes
from tests.conftest import LiveServer
from tests.integration.dialects.conftest import TEXTS

pytestmark = pytest.mark.integration

TYPES = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
#: Cohere's embedding type -> the same output asked of /v1/embeddings.
NATIVE = {
    "float": {},
    "int8": {"embedding_type": "int8"},
    "uint8": {"embedding_type": "uint8"},
    "binary": {"embedding_type": "binary"},
    "ubinary": {"embedding_type": "ubinary"},
    "base64": {"encoding_format": "base64"},
}


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as client:
        yield client


def native(server: LiveServer, model: str, inputs: list[str], **extra: Any) -> list[Any]:
    with server.client() as client:
        response = client.post("/v1/embeddings", json={"model": model, "input": inputs, **extra})
    assert response.status_code == 200, response.text
    return [d["embedding"] for d in response.json()["data"]]


def as_array(value: object) -> np.ndarray:
    return np.asarray(value, dtype=np.float64)


def data_uri(seed: int) -> str:
    return "data:image/png;base64," + base64.b64encode(image_bytes(40, 30, seed=seed)).decode("ascii")


# cohere's v1 client merges batched answers through a pydantic API deprecated in 2.11 (its code, not ours).
@pytest.mark.filterwarnings("ignore:Accessing the 'model_fields' attribute on the instance:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:The `parse_obj` method is deprecated:DeprecationWarning")
def test_v1_client_every_embedding_type_in_one_call(dialect_server: LiveServer, http: httpx.Client) -> None:
    import cohere

    client = cohere.Client(api_key="unused", base_url=dialect_server.url, httpx_client=http)
    answer = client.embed(texts=TEXTS, model="dense", input_type="search_document", embedding_types=TYPES)
    floats = client.embed(texts=TEXTS, model="dense", input_type="search_document")
    assert answer.response_type == "embeddings_by_type"
    by_type = answer.embeddings
    for kind in TYPES:
        got = getattr(by_type, "float_" if kind == "float" else kind)
        expected = native(dialect_server, "dense", TEXTS, prompt_name="document", **NATIVE[kind])
        if kind == "float":
            np.testing.assert_allclose(as_array(got), as_array(expected), atol=1e-6)
        else:
            assert got == expected, kind
    assert floats.response_type == "embeddings_floats"
    np.testing.assert_allclose(as_array(floats.embeddings), as_array(by_type.float_), atol=1e-7)
    assert answer.texts == TEXTS


def test_v2_client_input_types_dimension_and_truncation(dialect_server: LiveServer, http: httpx.Client) -> None:
    import cohere

    client = cohere.ClientV2(api_key="unused", base_url=dialect_server.url, httpx_client=http)
    query = client.embed(texts=TEXTS, model="dense", input_type="search_query", embedding_types=["float"])
    plain = client.embed(texts=TEXTS, model="dense", input_type="classification", embedding_types=["float"])
    short = client.embed(
        texts=TEXTS, model="dense", input_type="clustering", embedding_types=["float", "int8"], output_dimension=8
    )
    np.testing.assert_allclose(
        as_array(query.embeddings.float_),
        as_array(native(dialect_server, "dense", TEXTS, prompt_name="query")),
        atol=1e-6,
    )
    np.testing.assert_allclose(
        as_array(plain.embeddings.float_), as_array(native(dialect_server, "dense", TEXTS)), atol=1e-6
    )
    np.testing.assert_allclose(
        as_array(short.embeddings.float_), as_array(native(dialect_server, "dense", TEXTS, dimensions=8)), atol=1e-6
    )
    assert short.embeddings.int8 == native(dialect_server, "dense", TEXTS, dimensions=8, embedding_type="int8")
    long_text = "word " * 400
    cut = client.embed(texts=[long_text], model="dense", input_type="search_document", truncate="END")
    assert cut.embeddings.float_ is not None
    start = client.embed(texts=[long_text], model="dense", input_type="search_document", truncate="START")
    with dialect_server.client() as http_client:
        left = http_client.post(
            "/embed",
            json={"inputs": long_text, "model": "dense", "prompt_name": "document", "truncation_direction": "left"},
        ).json()
    np.testing.assert_allclose(as_array(start.embeddings.float_), as_array(left), atol=1e-6)
    with pytest.raises(cohere.core.ApiError) as refused:
        client.embed(texts=[long_text], model="dense", input_type="search_document", truncate="NONE")
    assert refused.value.status_code == 400


def test_v2_images_and_mixed_inputs_with_clip(dialect_server: LiveServer, http: httpx.Client) -> None:
    import cohere

    client = cohere.ClientV2(api_key="unused", base_url=dialect_server.url, httpx_client=http)
    images = [data_uri(0), data_uri(1)]
    by_images = client.embed(images=images, model="clip", input_type="image", embedding_types=["float"])
    inputs = [
        cohere.EmbedInput(content=[cohere.TextEmbedContent(text=TEXTS[0])]),
        cohere.EmbedInput(content=[cohere.ImageUrlEmbedContent(image_url=cohere.EmbedImageUrl(url=images[1]))]),
    ]
    mixed = client.embed(inputs=inputs, model="clip", input_type="search_document", embedding_types=["float", "binary"])
    photos = native(dialect_server, "clip", images, modality="image")
    words = native(dialect_server, "clip", TEXTS[:1])
    np.testing.assert_allclose(as_array(by_images.embeddings.float_), as_array(photos), atol=1e-5)
    np.testing.assert_allclose(as_array(mixed.embeddings.float_), as_array([words[0], photos[1]]), atol=1e-5)
    assert mixed.embeddings.binary is not None
    assert len(mixed.embeddings.binary[0]) == len(photos[0]) // 8


BAD: list[tuple[str, dict[str, Any], int]] = [
    ("texts and images", {"texts": ["a"], "images": [data_uri(0)]}, 400),
    ("nothing to embed", {"input_type": "search_query"}, 400),
    ("unknown embedding type", {"texts": ["a"], "embedding_types": ["float16"]}, 422),
    ("output_dimension too large", {"texts": ["a"], "output_dimension": 10_000}, 400),
    (
        "text and image in one input",
        {
            "inputs": [
                {"content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": data_uri(0)}}]}
            ]
        },
        400,
    ),
    (
        "two images in one input",
        {
            "inputs": [
                {"content": [{"type": "image_url", "image_url": {"url": data_uri(i)}} for i in (0, 1)]},
            ]
        },
        400,
    ),
    ("unknown model", {"texts": ["a"], "model": "nope"}, 404),
]


@pytest.mark.parametrize(("case", "body", "status"), BAD, ids=[c[0] for c in BAD])
def test_bad_embed_requests_answer_in_the_openai_shape(
    dialect_server: LiveServer, case: str, body: dict[str, Any], status: int
) -> None:
    with dialect_server.client() as client:
        response = client.post("/v2/embed", json={"model": "clip", **body})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"]
    assert error["code"] in {"invalid_input", "invalid_body", "model_not_found", "unsupported_operation"}


def test_model_selection_with_several_models(dialect_server: LiveServer) -> None:
    with dialect_server.client() as client:
        a = client.post("/v1/embed", json={"model": "dense", "texts": TEXTS[:1]}).json()["embeddings"]
        b = client.post("/v1/embed", json={"model": "all-MiniLM-L6-v2", "texts": TEXTS[:1]}).json()["embeddings"]
    assert len(a[0]) == 32
    assert len(b[0]) == 384
    np.testing.assert_allclose(as_array(b), as_array(native(dialect_server, "all-MiniLM-L6-v2", TEXTS[:1])), atol=1e-6)


def test_rerank_max_tokens_per_doc_scores_the_first_tokens(
    dialect_server: LiveServer, http: httpx.Client, dialect_models: dict[str, Path]
) -> None:
    import cohere
    from transformers import AutoTokenizer

    documents = [f"{t} {TEXTS[(i + 1) % 3]}" for i, t in enumerate(TEXTS)]
    tokenizer = AutoTokenizer.from_pretrained(str(dialect_models["ce"]))
    offsets = tokenizer(documents, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    heads = [d[: o[3][1]] for d, o in zip(documents, offsets, strict=True)]  # the first 4 tokens
    client = cohere.ClientV2(api_key="unused", base_url=dialect_server.url, httpx_client=http)
    cut = client.rerank(model="ce", query="guitar", documents=documents, max_tokens_per_doc=4)
    whole = client.rerank(model="ce", query="guitar", documents=documents)
    with dialect_server.client() as native:
        expected = native.post("/rerank", json={"model": "ce", "query": "guitar", "documents": heads}).json()
    by_index = {r["index"]: r["relevance_score"] for r in expected["results"]}
    assert [r.relevance_score for r in cut.results] == pytest.approx([by_index[r.index] for r in cut.results], abs=1e-6)
    assert [r.relevance_score for r in cut.results] != pytest.approx([r.relevance_score for r in whole.results])
