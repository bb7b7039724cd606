"""Qwen3-VL-Reranker over HTTP on a tiny random model in the published layout (Qwen3-VL's files,
no sentence-transformers modules, `kind: reranker`), against the reference code's recipe written
out here: a system message asking for "yes" or "no", a user message of "<Instruct>: " and the
instruction, "<Query>:" and the query, "\\n<Document>:" and the document (its image, then its
text), the chat template with the assistant's turn opened, the reference's cut of an over-long
pair (special tokens kept, the last 5 tokens kept), each pair on its own, the last position of
`Qwen3VLForConditionalGeneration`'s language model times the LM head's 'yes' row minus its 'no'
row, and the sigmoid of that."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from tests.builders.qwen3_vl import tiny_qwen3_vl_reranker
from tests.conftest import LiveServer
from tests.integration.zoo.test_qwen3_vl_embedding import IMAGES, data_uri, reference_image

pytestmark = pytest.mark.integration

QUERY = "which animal sleeps on the windowsill"
DOCUMENTS = [
    "a cat sleeps on the warm windowsill",
    "two dogs run through the snow",
    "What is the capital?",
    "",
]
SYSTEM = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the "
    'answer can only be "yes" or "no".'
)
DEFAULT = "Given a search query, retrieve relevant candidates that answer the query."
TOLERANCE = 1e-4


# ---- the reference --------------------------------------------------------------------------------


class Reference:
    def __init__(self, root: Path) -> None:
        from transformers import AutoProcessor, Qwen3VLForConditionalGeneration

        self.processor = AutoProcessor.from_pretrained(str(root), padding_side="left")
        whole = Qwen3VLForConditionalGeneration.from_pretrained(str(root), dtype=torch.float32).eval()
        vocabulary = self.processor.tokenizer.get_vocab()
        head = whole.lm_head.weight.data
        self.weight = head[vocabulary["yes"]] - head[vocabulary["no"]]
        self.model = whole.model

    def conversation(self, query: str, document: str | None, image: Any, instruction: str | None) -> list[Any]:
        content: list[dict[str, Any]] = [{"type": "text", "text": "<Instruct>: " + (instruction or DEFAULT)}]
        content += [{"type": "text", "text": "<Query>:"}, {"type": "text", "text": query}]
        content.append({"type": "text", "text": "\n<Document>:"})
        if image is not None:
            content.append({"type": "image", "image": image})
        if document is not None:
            content.append({"type": "text", "text": document})
        return [
            {"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
            {"role": "user", "content": content},
        ]

    def score(
        self,
        documents: list[dict[str, Any]],
        instruction: str | None = None,
        max_length: int = 10240,
        query: str = QUERY,
    ) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """p(yes), the log-odds and the sequence length of each document ({"text", "image"}), one
        pair at a time as the reference's `process` scores them."""
        probabilities, odds, lengths = [], [], []
        special = set(self.processor.tokenizer.all_special_ids)
        for given in documents:
            image = reference_image(given["image"]) if given.get("image") is not None else None
            pair = self.conversation(query, given.get("text"), image, instruction)
            text = self.processor.apply_chat_template([pair], tokenize=False, add_generation_prompt=True)
            encoded = self.processor(
                text=text,
                images=[image] if image is not None else None,
                truncation=False,
                padding=False,
                do_resize=False,
                return_tensors="pt",
            )
            ids = encoded["input_ids"][0].tolist()
            keep = [True] * len(ids)
            if len(ids) - 5 > max_length:  # special tokens stay; the first others fill the rest
                room = max_length - sum(1 for t in ids[:-5] if t in special)
                for i, token in enumerate(ids[:-5]):
                    if token not in special:
                        keep[i] = room > 0
                        room -= 1
            mask = torch.tensor(keep)
            inputs = {
                k: (v[:, mask] if k in ("input_ids", "attention_mask", "mm_token_type_ids") else v)
                for k, v in encoded.items()
            }
            with torch.no_grad():
                last = self.model(**inputs).last_hidden_state[:, -1]
                logit = (last @ self.weight)[0]
            odds.append(float(logit))
            probabilities.append(float(torch.sigmoid(logit)))
            lengths.append(int(mask.sum()))
        return np.asarray(probabilities), np.asarray(odds), lengths


# ---- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_qwen3_vl_reranker(tmp_path_factory.mktemp("qwen3vl-reranker") / "model")


@pytest.fixture(scope="module")
def reference(files: Path) -> Reference:
    return Reference(files)


def entry(files: Path, **extra: Any) -> dict[str, Any]:
    return {"name": "vlr", "source": str(files), "kind": "reranker", "dtype": "float32", **extra}


@pytest.fixture
def client(serve: Any, files: Path) -> Iterator[httpx.Client]:
    live: LiveServer = serve({"models": [entry(files)]})
    with live.client() as opened:
        yield opened


def by_index(answer: httpx.Response, key: str = "relevance_score") -> np.ndarray:
    assert answer.status_code == 200, answer.text
    body = answer.json()
    rows = body if isinstance(body, list) else body["results"]
    found = {r["index"]: r[key] for r in rows}
    return np.asarray([found[i] for i in range(len(found))])


def rerank(client: httpx.Client, documents: list[str], path: str = "/rerank", **extra: Any) -> np.ndarray:
    return by_index(client.post(path, json={"model": "vlr", "query": QUERY, "documents": documents, **extra}))


def rerank_images(client: httpx.Client, images: list[bytes], **extra: Any) -> httpx.Response:
    body = {"model": "vlr", "query": QUERY, "documents": [data_uri(i) for i in images], **extra}
    return client.post("/v1/rerank/images", json=body)


# ---- tests --------------------------------------------------------------------------------------


def test_text_documents_score_as_the_reference_on_every_rerank_dialect(
    client: httpx.Client, reference: Reference
) -> None:
    expected, odds, lengths = reference.score([{"text": d} for d in DOCUMENTS])
    assert np.ptp(expected) > 1e-3  # the scores differ enough for the comparison to mean something
    infinity = client.post("/rerank", json={"model": "vlr", "query": QUERY, "documents": DOCUMENTS})
    np.testing.assert_allclose(by_index(infinity), expected, atol=TOLERANCE)
    assert infinity.json()["usage"]["prompt_tokens"] == sum(lengths)
    np.testing.assert_allclose(rerank(client, DOCUMENTS, "/v1/rerank"), expected, atol=TOLERANCE)
    np.testing.assert_allclose(rerank(client, DOCUMENTS, "/v2/rerank"), expected, atol=TOLERANCE)
    np.testing.assert_allclose(rerank(client, DOCUMENTS, raw_scores=True), odds, atol=TOLERANCE)
    tei = client.post("/rerank", json={"model": "vlr", "query": QUERY, "texts": DOCUMENTS})
    np.testing.assert_allclose(by_index(tei, "score"), expected, atol=TOLERANCE)
    # vLLM's score takes no empty text.
    vllm = client.post("/score", json={"model": "vlr", "text_1": QUERY, "text_2": DOCUMENTS[:3]})
    assert vllm.status_code == 200, vllm.text
    np.testing.assert_allclose([row["score"] for row in vllm.json()["data"]], expected[:3], atol=TOLERANCE)


def test_what_needs_a_text_tokenizer_is_a_clear_400(client: httpx.Client) -> None:
    """The document is cut inside the pair's prompt, never before it: `max_tokens_per_doc` and a
    cut on the left have no tokenizer to cut it with."""
    body = {"model": "vlr", "query": QUERY, "documents": DOCUMENTS}
    capped = client.post("/v2/rerank", json={**body, "max_tokens_per_doc": 3})
    assert capped.status_code == 400, capped.text
    embedded = client.post("/v1/embeddings", json={"model": "vlr", "input": ["a cat"]})
    assert embedded.status_code == 400, embedded.text


def test_one_at_a_time_equals_batched(client: httpx.Client) -> None:
    batched = rerank(client, DOCUMENTS)
    single = [rerank(client, [d])[0] for d in DOCUMENTS]
    np.testing.assert_allclose(single, batched, atol=1e-5)


def test_a_request_instruction_scores_as_the_reference(client: httpx.Client, reference: Reference) -> None:
    instruction = "Find the passage about pets"
    expected, _, _ = reference.score([{"text": d} for d in DOCUMENTS], instruction)
    plain, _, _ = reference.score([{"text": d} for d in DOCUMENTS])
    assert np.abs(expected - plain).max() > 1e-3  # the instruction changes the scores
    np.testing.assert_allclose(rerank(client, DOCUMENTS, instruction=instruction), expected, atol=TOLERANCE)
    np.testing.assert_allclose(
        rerank(client, DOCUMENTS, "/v1/rerank", instruction=instruction), expected, atol=TOLERANCE
    )
    # An empty instruction is the default one, as the reference's `instruct or default` reads it.
    np.testing.assert_allclose(rerank(client, DOCUMENTS, instruction=""), plain, atol=TOLERANCE)


def test_the_configured_instruction_is_the_default(serve: Any, files: Path, reference: Reference) -> None:
    instruction = "Judge relevance to pets"
    expected, _, _ = reference.score([{"text": d} for d in DOCUMENTS], instruction)
    live = serve({"models": [entry(files, instruction=instruction)]})
    with live.client() as opened:
        np.testing.assert_allclose(rerank(opened, DOCUMENTS), expected, atol=TOLERANCE)
        described = {m["id"]: m for m in opened.get("/v1/models").json()["data"]}["vlr"]
    assert described["kind"] == "reranker"
    assert "rerank" in described["capabilities"]


def test_image_documents_score_as_the_reference(client: httpx.Client, reference: Reference) -> None:
    expected, _, lengths = reference.score([{"image": i} for i in IMAGES])
    assert np.ptp(expected) > 1e-4
    answer = rerank_images(client, IMAGES)
    np.testing.assert_allclose(by_index(answer), expected, atol=TOLERANCE)
    assert answer.json()["usage"]["prompt_tokens"] == sum(lengths)  # visual tokens count
    single = [by_index(rerank_images(client, [i]))[0] for i in IMAGES]
    np.testing.assert_allclose(single, by_index(answer), atol=1e-5)
    uploads = [("file", (f"{i}.png", data, "image/png")) for i, data in enumerate(IMAGES)]
    uploaded = client.post("/v1/rerank/images/upload", data={"model": "vlr", "query": QUERY}, files=uploads)
    np.testing.assert_allclose(by_index(uploaded), expected, atol=TOLERANCE)
    instruction = "Find the picture of a cat"
    instructed, _, _ = reference.score([{"image": i} for i in IMAGES], instruction)
    np.testing.assert_allclose(
        by_index(rerank_images(client, IMAGES, instruction=instruction)), instructed, atol=TOLERANCE
    )


def test_an_over_long_pair_is_cut_as_the_reference_cuts_it(serve: Any, files: Path, reference: Reference) -> None:
    long = " ".join(["the cat sleeps on the warm windowsill and dreams"] * 12)
    documents = [long, DOCUMENTS[1]]
    expected, _, lengths = reference.score([{"text": d} for d in documents], max_length=60)
    whole, _, _ = reference.score([{"text": long}])
    assert lengths[0] == 65  # 60 cut to, then the last 5
    assert abs(whole[0] - expected[0]) > 1e-4  # the cut changes the score
    live = serve({"models": [entry(files, max_length=60)]})
    with live.client() as opened:
        answer = opened.post("/rerank", json={"model": "vlr", "query": QUERY, "documents": documents})
        np.testing.assert_allclose(by_index(answer), expected, atol=TOLERANCE)
        assert answer.json()["usage"]["prompt_tokens"] == sum(lengths)
        image = rerank_images(opened, [IMAGES[3]])
    assert image.status_code == 200, image.text  # special tokens are never cut: the wide image stays whole


def test_the_fixed_prompt_keys_are_refused(serve: Any, files: Path) -> None:
    live = serve({"models": [entry(files, template="{query} {document}")]})
    with live.client() as opened:
        answer = opened.post("/rerank", json={"model": "vlr", "query": QUERY, "documents": DOCUMENTS})
    assert answer.status_code == 503, answer.text
    assert "template" in answer.json()["error"]["message"]


def test_documents_holding_a_text_and_an_image_score_as_the_reference(
    client: httpx.Client, reference: Reference
) -> None:
    """An object document `{image, text}`: one pair, its image then its text after "<Document>:",
    as the reference's `format_mm_content` lays out a document given both; batched with image
    documents, and each alone the same."""
    given: list[dict[str, Any]] = [
        {"image": IMAGES[0], "text": DOCUMENTS[0]},
        {"image": IMAGES[1], "text": DOCUMENTS[1]},
        {"image": IMAGES[2]},
        {"image": IMAGES[3], "text": DOCUMENTS[2]},
    ]
    sent: list[Any] = [
        {"image": data_uri(g["image"]), "text": g["text"]} if "text" in g else data_uri(g["image"]) for g in given
    ]
    body = {"model": "vlr", "query": QUERY, "documents": sent, "return_documents": True}
    answer = client.post("/v1/rerank/images", json=body)
    expected, _, lengths = reference.score(given)
    got = by_index(answer)
    np.testing.assert_allclose(got, expected, atol=TOLERANCE)
    print(f"mixed documents: largest difference from the reference {np.abs(got - expected).max():.2e}")
    assert answer.json()["usage"]["prompt_tokens"] == sum(lengths)  # text and visual tokens
    assert {r["index"]: r["document"] for r in answer.json()["results"]}[0] == sent[0]
    pictures, _, _ = reference.score([{"image": g["image"]} for g in given])
    assert abs(expected[0] - pictures[0]) > 1e-4  # the text counts
    for i, document in enumerate(sent):
        single = client.post("/v1/rerank/images", json={"model": "vlr", "query": QUERY, "documents": [document]})
        np.testing.assert_allclose(by_index(single)[0], got[i], atol=1e-5)
    instruction = "Find the picture of a cat"
    instructed, _, _ = reference.score(given, instruction)
    body = {"model": "vlr", "query": QUERY, "documents": sent, "instruction": instruction}
    np.testing.assert_allclose(by_index(client.post("/v1/rerank/images", json=body)), instructed, atol=TOLERANCE)
    no_image = {"model": "vlr", "query": QUERY, "documents": [{"text": DOCUMENTS[0]}]}
    refused = client.post("/v1/rerank/images", json=no_image)
    assert refused.status_code == 400, refused.text
    assert "has no image" in refused.json()["error"]["message"]
