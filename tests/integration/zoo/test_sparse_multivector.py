"""SPLADE, ColBERT and BGE-M3 over HTTP (`/v1/encode`), against plain-torch references."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.builders.zoo import tiny_bge_m3, tiny_colbert, tiny_masked_lm

pytestmark = pytest.mark.integration

TEXTS = [
    "The cat sleeps on the warm windowsill.",
    "Two dogs are running through the snow!",
    "What is the capital of France? Paris, of course.",
    "hello",
]


def encode(client: Any, model: str, texts: list[str], **extra: Any) -> list[dict[str, Any]]:
    response = client.post("/v1/encode", json={"model": model, "input": texts, **extra})
    assert response.status_code == 200, response.text
    data: list[dict[str, Any]] = response.json()["data"]
    return data


def as_dict(sparse: dict[str, Any]) -> dict[int, float]:
    return dict(zip(sparse["indices"], sparse["values"], strict=True))


# ---- SPLADE -----------------------------------------------------------------------------------


def splade_reference(directory: Path, text: str) -> dict[int, float]:
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModelForMaskedLM.from_pretrained(str(directory)).eval()
    with torch.no_grad():
        logits = model(**tokenizer(text, return_tensors="pt")).logits[0]
    weights = torch.log1p(torch.relu(logits)).max(dim=0).values
    return {int(i): float(weights[i]) for i in torch.nonzero(weights).flatten()}


@pytest.mark.parametrize("layout", [False, True])
def test_splade_matches_the_formula(serve: Any, tmp_path: Path, layout: bool) -> None:
    directory = tiny_masked_lm(tmp_path / "splade", sparse_layout=layout)
    entry: dict[str, Any] = {"name": "splade", "source": str(directory), "backend": "torch"}
    if not layout:
        entry["kind"] = "sparse"
    server = serve({"models": [entry]})
    with server.client() as client:
        batched = encode(client, "splade", TEXTS, outputs=["sparse"], return_tokens=True)
        single = [encode(client, "splade", [t], outputs=["sparse"])[0] for t in TEXTS]
        dense = client.post("/v1/embeddings", json={"model": "splade", "input": ["a"]})
    for text, got, alone in zip(TEXTS, batched, single, strict=True):
        expected = splade_reference(directory, text)
        got_map = as_dict(got["sparse"])
        assert sorted(got_map) == sorted(expected)
        np.testing.assert_allclose(
            [got_map[i] for i in sorted(expected)], [expected[i] for i in sorted(expected)], atol=1e-5
        )
        assert sorted(as_dict(alone["sparse"])) == sorted(got_map)
        np.testing.assert_allclose(alone["sparse"]["values"], got["sparse"]["values"], atol=1e-5)
        assert len(got["sparse"]["tokens"]) == len(got["sparse"]["indices"])
    assert dense.status_code == 400
    assert "sparse" in dense.json()["error"]["message"]


def test_splade_pruning(serve: Any, tmp_path: Path) -> None:
    directory = tiny_masked_lm(tmp_path / "splade")
    config = {
        "models": [
            {"name": "full", "source": str(directory), "backend": "torch", "kind": "sparse"},
            {"name": "top", "source": str(directory), "backend": "torch", "kind": "sparse", "options": {"top_k": 5}},
            {
                "name": "cut",
                "source": str(directory),
                "backend": "torch",
                "kind": "sparse",
                "options": {"threshold": 0.5},
            },
        ]
    }
    server = serve(config)
    with server.client() as client:
        full = as_dict(encode(client, "full", TEXTS[:1], outputs=["sparse"])[0]["sparse"])
        top = as_dict(encode(client, "top", TEXTS[:1], outputs=["sparse"])[0]["sparse"])
        cut = as_dict(encode(client, "cut", TEXTS[:1], outputs=["sparse"])[0]["sparse"])
    best = sorted(full, key=lambda i: -full[i])[:5]
    assert sorted(top) == sorted(best)
    assert cut == {i: v for i, v in full.items() if v > 0.5}


def test_real_splade_model_gives_sensible_top_terms(serve: Any) -> None:
    server = serve(
        {"models": [{"name": "splade", "source": "package:cognition", "backend": "torch", "kind": "sparse"}]}
    )
    text = "The quick brown fox jumps over the lazy dog near the river bank."
    with server.client() as client:
        sparse = encode(client, "splade", [text], outputs=["sparse"], return_tokens=True)[0]["sparse"]
    ranked = [t for _, t in sorted(zip(sparse["values"], sparse["tokens"], strict=True), reverse=True)]
    words = {"quick", "brown", "fox", "jumps", "lazy", "dog", "river", "bank"}
    assert len(words & set(ranked[:15])) >= 4, ranked[:15]


# ---- ColBERT ----------------------------------------------------------------------------------


def colbert_reference(directory: Path, text: str, *, query: bool) -> np.ndarray:
    """colbert-ai's method in plain torch: '. ' placeholder replaced by the marker, [MASK] padding."""
    import json

    from safetensors.torch import load_file
    from transformers import AutoTokenizer, BertConfig, BertModel

    meta = json.loads((directory / "artifact.metadata").read_text())
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    state = load_file(str(directory / "model.safetensors"))
    bert = BertModel(BertConfig.from_pretrained(str(directory)), add_pooling_layer=False).eval()
    bert.load_state_dict({k.removeprefix("bert."): v for k, v in state.items() if k.startswith("bert.")})
    linear = state["linear.weight"]
    if query:
        enc = tokenizer(
            ". " + text, padding="max_length", truncation=True, max_length=meta["query_maxlen"], return_tensors="pt"
        )
        ids, mask = enc["input_ids"], enc["attention_mask"]
        ids[:, 1] = tokenizer.convert_tokens_to_ids(meta["query_token_id"])
        ids[ids == tokenizer.pad_token_id] = tokenizer.mask_token_id
        keep = torch.ones_like(ids, dtype=torch.bool)
    else:
        enc = tokenizer(". " + text, truncation=True, max_length=meta["doc_maxlen"], return_tensors="pt")
        ids, mask = enc["input_ids"], enc["attention_mask"]
        ids[:, 1] = tokenizer.convert_tokens_to_ids(meta["doc_token_id"])
        skip = {tokenizer.encode(p, add_special_tokens=False)[0] for p in string.punctuation}
        keep = torch.tensor([[t not in skip and t != tokenizer.pad_token_id for t in ids[0].tolist()]])
    with torch.no_grad():
        vectors = bert(input_ids=ids, attention_mask=mask)[0] @ linear.T
    vectors = torch.nn.functional.normalize(vectors, dim=-1)
    return vectors[0][keep[0]].numpy()


def test_colbert_matches_colbert_ai_method(serve: Any, tmp_path: Path) -> None:
    directory = tiny_colbert(tmp_path / "colbert")
    long_doc = " ".join(TEXTS * 3)
    docs = [*TEXTS, long_doc]
    server = serve({"models": [{"name": "colbert", "source": str(directory), "backend": "torch"}]})
    with server.client() as client:
        queries = encode(client, "colbert", TEXTS, outputs=["multivector"], prompt_name="query")
        documents = encode(client, "colbert", docs, outputs=["multivector"])
        single = [encode(client, "colbert", [d], outputs=["multivector"])[0] for d in docs]
        b64 = encode(client, "colbert", docs[:2], outputs=["multivector"], encoding_format="base64")
        ranked = client.post("/rerank", json={"model": "colbert", "query": TEXTS[0], "documents": TEXTS}).json()
    for text, got in zip(TEXTS, queries, strict=True):
        expected = colbert_reference(directory, text, query=True)
        assert np.asarray(got["multivector"]).shape == (12, 16)
        np.testing.assert_allclose(got["multivector"], expected, atol=1e-5)
    for text, got, alone in zip(docs, documents, single, strict=True):
        expected = colbert_reference(directory, text, query=False)
        np.testing.assert_allclose(got["multivector"], expected, atol=1e-5)
        np.testing.assert_allclose(alone["multivector"], got["multivector"], atol=1e-5)
    import base64

    decoded = np.frombuffer(base64.b64decode(b64[1]["multivector"]["data"]), dtype="<f4")
    np.testing.assert_allclose(decoded.reshape(b64[1]["multivector"]["shape"]), documents[1]["multivector"], atol=1e-6)
    assert ranked["meta"]["scoring_method"] == "maxsim"
    q = np.asarray(queries[0]["multivector"])
    expected_scores = {
        i: float((q @ np.asarray(d["multivector"]).T).max(axis=1).sum()) for i, d in enumerate(documents[:4])
    }
    for result in ranked["results"]:
        assert result["relevance_score"] == pytest.approx(expected_scores[result["index"]], abs=1e-4)


# ---- BGE-M3 -----------------------------------------------------------------------------------


def m3_reference(directory: Path, text: str) -> tuple[np.ndarray, dict[int, float], np.ndarray]:
    """FlagEmbedding's formulas in plain torch, one text at a time (no padding)."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModel.from_pretrained(str(directory)).eval()
    colbert, sparse = torch.nn.Linear(32, 32), torch.nn.Linear(32, 1)
    colbert.load_state_dict(torch.load(directory / "colbert_linear.pt", weights_only=True))
    sparse.load_state_dict(torch.load(directory / "sparse_linear.pt", weights_only=True))
    enc = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        states = model(**enc).last_hidden_state[0]
        dense = torch.nn.functional.normalize(states[0], dim=-1).numpy()
        weights = torch.relu(sparse(states)).squeeze(-1)
        vectors = torch.nn.functional.normalize(colbert(states[1:]), dim=-1).numpy()
    skip = {tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    lexical: dict[int, float] = {}
    for token, weight in zip(enc["input_ids"][0].tolist(), weights.tolist(), strict=True):
        if token not in skip and weight > lexical.get(token, 0.0):
            lexical[token] = weight
    return dense, lexical, vectors


def test_bge_m3_three_outputs_in_one_call(serve: Any, tmp_path: Path) -> None:
    directory = tiny_bge_m3(tmp_path / "m3")
    server = serve({"models": [{"name": "m3", "source": str(directory), "backend": "torch"}]})
    every = ["dense", "sparse", "multivector"]
    with server.client() as client:
        together = encode(client, "m3", TEXTS, outputs=every)
        apart = {name: encode(client, "m3", TEXTS, outputs=[name]) for name in every}
        single = [encode(client, "m3", [t], outputs=every)[0] for t in TEXTS]
        openai_dense = client.post("/v1/embeddings", json={"model": "m3", "input": TEXTS}).json()["data"]
        ranked = client.post("/rerank", json={"model": "m3", "query": TEXTS[0], "documents": TEXTS}).json()
    for i, text in enumerate(TEXTS):
        dense, lexical, vectors = m3_reference(directory, text)
        got = together[i]
        np.testing.assert_allclose(got["dense"], dense, atol=1e-5)
        assert sorted(as_dict(got["sparse"])) == sorted(lexical)
        np.testing.assert_allclose(
            [as_dict(got["sparse"])[k] for k in sorted(lexical)], [lexical[k] for k in sorted(lexical)], atol=1e-5
        )
        np.testing.assert_allclose(got["multivector"], vectors, atol=1e-5)
        for name in every:
            assert set(apart[name][i]) == {"object", "index", name}
            np.testing.assert_allclose(
                np.asarray(apart[name][i][name] if name != "sparse" else apart[name][i][name]["values"]),
                np.asarray(got[name] if name != "sparse" else got[name]["values"]),
                atol=1e-6,
            )
        np.testing.assert_allclose(single[i]["dense"], got["dense"], atol=1e-5)
        np.testing.assert_allclose(single[i]["multivector"], got["multivector"], atol=1e-5)
        np.testing.assert_allclose(single[i]["sparse"]["values"], got["sparse"]["values"], atol=1e-5)
        np.testing.assert_allclose(openai_dense[i]["embedding"], dense, atol=1e-5)
    assert ranked["meta"]["scoring_method"] == "maxsim"
    q = np.asarray(together[0]["multivector"])
    for result in ranked["results"]:
        d = np.asarray(together[result["index"]]["multivector"])
        assert result["relevance_score"] == pytest.approx(float((q @ d.T).max(axis=1).sum() / len(q)), abs=1e-4)


def test_embedding_types_over_http(serve: Any, tmp_path: Path) -> None:
    import base64

    from infinity_server.encoding import encode_vectors

    directory = tiny_bge_m3(tmp_path / "m3")
    server = serve({"models": [{"name": "m3", "source": str(directory), "backend": "torch"}]})
    with server.client() as client:
        floats = encode(client, "m3", TEXTS, outputs=["dense", "multivector"])
        for dtype in ("int8", "uint8", "binary", "ubinary"):
            quantized = encode(client, "m3", TEXTS, outputs=["dense", "multivector"], embedding_type=dtype)
            b64 = encode(client, "m3", TEXTS, outputs=["multivector"], embedding_type=dtype, encoding_format="base64")
            openai = client.post("/v1/embeddings", json={"model": "m3", "input": TEXTS, "embedding_type": dtype})
            dense = [np.asarray(f["dense"], np.float32) for f in floats]
            multi = [np.asarray(f["multivector"], np.float32) for f in floats]
            assert [q["dense"] for q in quantized] == encode_vectors(dense, dtype, "float")
            assert [q["multivector"] for q in quantized] == encode_vectors(multi, dtype, "float")
            assert [d["embedding"] for d in openai.json()["data"]] == [q["dense"] for q in quantized]
            wire = b64[1]["multivector"]
            raw = np.frombuffer(base64.b64decode(wire["data"]), dtype=wire["dtype"]).reshape(wire["shape"][0], -1)
            assert raw.tolist() == quantized[1]["multivector"]
        bad = client.post("/v1/encode", json={"model": "m3", "input": TEXTS, "embedding_type": "int4"})
    assert bad.status_code == 422


def test_pylate_checkpoint_matches_sentence_transformers(serve: Any, tmp_path: Path) -> None:
    from sentence_transformers import MultiVectorEncoder

    from tests.builders.zoo import tiny_pylate

    directory = tiny_pylate(tmp_path / "pylate")
    reference = MultiVectorEncoder(str(directory), device="cpu")
    docs = [*TEXTS, " ".join(TEXTS * 3)]
    expected_queries = [q.numpy() for q in reference.encode_query(TEXTS, convert_to_numpy=False)]
    expected_docs = [d.numpy() for d in reference.encode_document(docs, convert_to_numpy=False)]
    server = serve({"models": [{"name": "pylate", "source": str(directory), "backend": "torch"}]})
    with server.client() as client:
        queries = encode(client, "pylate", TEXTS, outputs=["multivector"], prompt_name="query")
        documents = encode(client, "pylate", docs, outputs=["multivector"])
        single = [encode(client, "pylate", [d], outputs=["multivector"])[0] for d in docs]
    for got, expected in zip(queries, expected_queries, strict=True):
        np.testing.assert_allclose(got["multivector"], expected, atol=1e-5)
    for got, alone, expected in zip(documents, single, expected_docs, strict=True):
        np.testing.assert_allclose(got["multivector"], expected, atol=1e-5)
        np.testing.assert_allclose(alone["multivector"], got["multivector"], atol=1e-5)


def test_rerank_with_splade_uses_the_sparse_dot_product(serve: Any, tmp_path: Path) -> None:
    directory = tiny_masked_lm(tmp_path / "splade")
    server = serve({"models": [{"name": "splade", "source": str(directory), "backend": "torch", "kind": "sparse"}]})
    with server.client() as client:
        ranked = client.post("/rerank", json={"model": "splade", "query": TEXTS[0], "documents": TEXTS}).json()
        vectors = [as_dict(e["sparse"]) for e in encode(client, "splade", TEXTS, outputs=["sparse"])]
    assert ranked["meta"]["scoring_method"] == "sparse-dot"
    query = vectors[0]
    for result in ranked["results"]:
        document = vectors[result["index"]]
        expected = sum(value * document.get(token, 0.0) for token, value in query.items())
        assert result["relevance_score"] == pytest.approx(expected, rel=1e-5)
