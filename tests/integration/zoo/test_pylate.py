"""PyLate ColBERT checkpoints over HTTP (`/v1/encode`, `/rerank`, `/pooling`) against PyLate's
formulas computed here with transformers on the same weights.

Layouts: GTE-ModernColBERT (ModernBERT, "[Q] "/"[D] " as added tokens, PyLate's Dense), the same with
the expansion settings changed, a BERT model that PyLate saved with colbert-ai's `[unused0]`/`[unused1]`
prefixes, and answerai-colbert-small in its colbert-ai layout (`artifact.metadata`, `linear.weight`).
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.builders.zoo import tiny_colbert, tiny_modern_colbert, tiny_pylate

pytestmark = pytest.mark.integration

TOL = 1e-4
QUERIES = ["What is the capital of France?", "two dogs in the snow", "hello"]
DOCUMENTS = [
    "The cat sleeps on the warm windowsill.",
    "Two dogs are running through the snow!",
    "What is the capital of France? Paris, of course; it is.",
    " ".join(["A plane is taking off from the airport, seen from far away."] * 4),
]

LAYOUTS: dict[str, Callable[[Path], Path]] = {
    "gte-moderncolbert": lambda p: tiny_modern_colbert(p),
    "moderncolbert-attending": lambda p: tiny_modern_colbert(p, attend=True, query_length=16, seed=1),
    "moderncolbert-no-expansion": lambda p: tiny_modern_colbert(p, expansion=False, seed=2),
    "answerai-colbert-small-pylate": lambda p: tiny_pylate(p, prefixes=("[unused0]", "[unused1]"), seed=3),
    "answerai-colbert-small": lambda p: tiny_colbert(p, seed=4),
}


@dataclass(frozen=True)
class PyLate:
    """PyLate's settings for a checkpoint, read as PyLate reads them."""

    prefixes: tuple[str, str]
    lengths: tuple[int, int]
    expansion: bool
    attend: bool
    skiplist: list[str]
    projection: torch.Tensor

    @classmethod
    def of(cls, directory: Path) -> PyLate:
        from safetensors.torch import load_file

        if (directory / "artifact.metadata").is_file():  # colbert-ai: PyLate's defaults for its keys
            meta = json.loads((directory / "artifact.metadata").read_text())
            weight = load_file(str(directory / "model.safetensors"))["linear.weight"]
            prefixes = (meta["query_token_id"], meta["doc_token_id"])
            lengths = (meta["query_maxlen"], meta["doc_maxlen"])
            return cls(prefixes, lengths, True, meta["attend_to_mask_tokens"], list(string.punctuation), weight)
        extra = json.loads((directory / "config_sentence_transformers.json").read_text())
        weight = load_file(str(directory / "1_Dense" / "model.safetensors"))["linear.weight"]
        expansion = extra.get("do_query_expansion", True)
        return cls(
            (extra["query_prefix"], extra["document_prefix"]),
            (extra["query_length"], extra["document_length"]),
            expansion,
            expansion and extra["attend_to_expansion_tokens"],
            extra["skiplist_words"],
            weight,
        )


def reference(directory: Path, texts: list[str], *, query: bool) -> list[np.ndarray]:
    """PyLate's encoding, one text at a time: cut to the length less one, the prefix token after the
    first token, queries padded with [MASK], the skiplist dropped from documents, then normalised."""
    from transformers import AutoModel, AutoTokenizer

    settings = PyLate.of(directory)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModel.from_pretrained(str(directory)).eval()
    return [encode_like_pylate(settings, tokenizer, model, text, query=query) for text in texts]


def encode_like_pylate(settings: PyLate, tokenizer: Any, model: Any, text: str, *, query: bool) -> np.ndarray:
    prefix = settings.prefixes[0 if query else 1]
    prefix_id = tokenizer.convert_tokens_to_ids(prefix)
    assert prefix_id != tokenizer.unk_token_id, f"the layout lacks its prefix token {prefix!r}"
    length = settings.lengths[0 if query else 1] - 1
    skip = {tokenizer.convert_tokens_to_ids(w) for w in settings.skiplist}
    ids = tokenizer(text, truncation=True, max_length=length)["input_ids"]
    mask = [1] * len(ids)
    if query and settings.expansion:
        ids, mask = ids + [tokenizer.mask_token_id] * (length - len(ids)), mask + [0] * (length - len(ids))
    ids, mask = [ids[0], prefix_id, *ids[1:]], [1, 1, *mask[1:]]
    if query and settings.attend:
        mask = [1] * len(mask)
    with torch.no_grad():
        states = model(input_ids=torch.tensor([ids]), attention_mask=torch.tensor([mask])).last_hidden_state[0]
    if query:
        keep = [True] * len(ids) if settings.expansion else [m == 1 for m in mask]
    else:
        keep = [t not in skip for t in ids]
    vectors = torch.nn.functional.normalize(states[torch.tensor(keep)] @ settings.projection.T, dim=-1)
    result: np.ndarray = vectors.numpy()
    return result


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    return float((query @ document.T).max(axis=1).sum())


def encode(client: Any, model: str, texts: list[str], **extra: Any) -> list[np.ndarray]:
    body = {"model": model, "input": texts, "outputs": ["multivector"], **extra}
    response = client.post("/v1/encode", json=body)
    assert response.status_code == 200, response.text
    return [np.asarray(d["multivector"], dtype=np.float32) for d in response.json()["data"]]


def assert_vectors(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=TOL)


#: Every layout on torch; on ONNX Runtime, which serves ColBERT too, one of each encoder and the
#: expansion tokens that attend.
ENGINES = [(layout, "torch") for layout in sorted(LAYOUTS)] + [
    ("gte-moderncolbert", "onnx"),
    ("moderncolbert-attending", "onnx"),
    ("answerai-colbert-small", "onnx"),
]


@pytest.mark.parametrize(("layout", "backend"), ENGINES)
def test_pylate_layouts_match_pylate(serve: Any, tmp_path: Path, layout: str, backend: str) -> None:
    directory = LAYOUTS[layout](tmp_path / layout)
    want_queries = reference(directory, QUERIES, query=True)
    want_documents = reference(directory, DOCUMENTS, query=False)
    entry = {"name": "colbert", "source": str(directory), "backend": backend, "device": "cpu"}
    server = serve({"models": [entry], "engine_cache": str(tmp_path / "engines")})
    with server.client() as client:
        queries = encode(client, "colbert", QUERIES, prompt_name="query")
        documents = encode(client, "colbert", DOCUMENTS)
        single = [encode(client, "colbert", [d])[0] for d in DOCUMENTS]
        single_queries = [encode(client, "colbert", [q], prompt_name="query")[0] for q in QUERIES]
        ranked = client.post("/rerank", json={"model": "colbert", "query": QUERIES[0], "documents": DOCUMENTS})
        pooled = client.post("/pooling", json={"model": "colbert", "input": DOCUMENTS})
    assert_vectors(queries, want_queries)
    assert_vectors(documents, want_documents)
    assert_vectors(single, documents)
    assert_vectors(single_queries, queries)
    assert ranked.status_code == 200, ranked.text
    assert ranked.json()["meta"]["scoring_method"] == "maxsim"
    scores = {r["index"]: r["relevance_score"] for r in ranked.json()["results"]}
    want_scores = [maxsim(want_queries[0], d) for d in want_documents]
    np.testing.assert_allclose([scores[i] for i in range(len(DOCUMENTS))], want_scores, atol=TOL)
    assert pooled.status_code == 200, pooled.text
    assert_vectors([np.asarray(d["data"], dtype=np.float32) for d in pooled.json()["data"]], want_documents)
    with server.client() as client:
        assert client.get("/v1/models/colbert").json()["details"]["engine"]["backend"] == backend


def test_expansion_settings_shape_the_query(serve: Any, tmp_path: Path) -> None:
    """With expansion a query has `query_length` vectors whatever its text; without, one per token."""
    expanded = tiny_modern_colbert(tmp_path / "expanded", query_length=16)
    plain = tiny_modern_colbert(tmp_path / "plain", expansion=False)
    server = serve({"models": [{"name": "e", "source": str(expanded)}, {"name": "p", "source": str(plain)}]})
    with server.client() as client:
        long_query = " ".join(QUERIES * 4)
        assert [v.shape[0] for v in encode(client, "e", ["hello", long_query], prompt_name="query")] == [16, 16]
        lengths = [v.shape[0] for v in encode(client, "p", ["hello", long_query], prompt_name="query")]
    assert lengths[0] < lengths[1] == 12


def test_a_tokenizer_without_the_prefix_is_refused(serve: Any, tmp_path: Path) -> None:
    directory = tiny_modern_colbert(tmp_path / "m")
    settings = json.loads((directory / "config_sentence_transformers.json").read_text())
    settings["query_prefix"] = "[QUERY] "
    (directory / "config_sentence_transformers.json").write_text(json.dumps(settings))
    server = serve({"models": [{"name": "m", "source": str(directory)}]})
    with server.client() as client:
        response = client.post("/v1/encode", json={"model": "m", "input": ["a"], "outputs": ["multivector"]})
        health = client.get("/health")
    assert response.status_code == 503, response.text
    assert "'[QUERY] '" in response.json()["error"]["message"]
    assert health.status_code == 200
