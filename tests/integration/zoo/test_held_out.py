"""Held-out families, each in its published layout, served with no `backend` key and compared with
its reference library on the same weights, in fp32, within 1e-4.

Each family is served on this host's CPU kind and, where `auto` would take another engine there,
on the CPU kinds that take it (`choice.cpu_flags` forced), so every engine `auto` may pick for it is
checked, and the engine that answered must be the one `auto` took. One server holds every
(family, CPU kind) entry. The cases in `BUGS` fail today and say why.
"""

from __future__ import annotations

import functools
import json
import string
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from model_registry.backends import choice
from tests.builders import held_out as built
from tests.conftest import LiveServer, start_server

pytestmark = pytest.mark.integration

TEXTS = [
    "A man is playing a guitar on the stage.",
    "What is the capital of France? Paris is the capital.",
    "Two Dogs are running through the SNOW!",
    "hello",
]
QUERY = "Which animal sleeps on the windowsill?"
DOCUMENTS = ["The cat sleeps on the warm windowsill.", "Stocks fell sharply on Monday.", "A plane is taking off.", "a"]
#: The flags that mark each CPU kind `auto` tells apart (`choice.CPU_KINDS`), in the order tried.
FLAGS = {"avx512_vnni": {"avx2", "avx512_vnni"}, "amx": {"avx2", "avx512_vnni", "amx_tile"}, "avx2": {"avx2"}}
TOLERANCE = 1e-4


@dataclass(frozen=True)
class Family:
    """A published checkpoint's family: its builder, what is compared, and what `auto` reads."""

    name: str
    build: Callable[[Path], Path]
    check: str
    model_type: str
    kind: str
    prompt: str | None = None


FAMILIES = [
    Family("all-mpnet-base-v2", built.tiny_all_mpnet, "embed", "mpnet", "dense"),
    Family("multi-qa-mpnet-base-dot-v1", built.tiny_multi_qa_mpnet_dot, "embed", "mpnet", "dense"),
    Family("LaBSE", built.tiny_labse, "embed", "bert", "dense"),
    Family("sentence-t5-base", built.tiny_sentence_t5, "embed", "t5", "dense"),
    Family("mxbai-embed-large-v1", built.tiny_mxbai_embed, "embed", "bert", "dense", prompt="query"),
    Family("granite-embedding-30m-english", built.tiny_granite_embedding, "embed", "roberta", "dense"),
    Family("all-distilroberta-v1", built.tiny_all_distilroberta, "embed", "roberta", "dense"),
    Family("msmarco-distilbert-base-v4", built.tiny_msmarco_distilbert, "embed", "distilbert", "dense"),
    Family("e5-mistral-7b-instruct", built.tiny_e5_mistral, "embed", "mistral", "dense", prompt="web_search_query"),
    Family("ms-marco-MiniLM-L6-v2", built.tiny_ms_marco_minilm, "rerank", "bert", "reranker"),
    Family("ms-marco-electra-base", built.tiny_ms_marco_electra, "rerank", "electra", "reranker"),
    Family("stsb-distilroberta-base", built.tiny_stsb_distilroberta, "rerank", "roberta", "reranker"),
    Family("distilcamembert-sentiment", built.tiny_camembert_classifier, "classify", "camembert", "classifier"),
    Family("splade-v3-distilbert", built.tiny_splade_distilbert, "sparse", "distilbert", "sparse"),
    Family("colbertv2.0", built.tiny_colbertv2, "multivector", "bert", "multivector"),
]


def picked(family: Family, host: str) -> str:
    """The engine `auto` takes for `family` on a CPU of kind `host`."""
    config = {"model_type": family.model_type}
    return choice.choose(family.name, "auto", "none", family.kind, config, "cpu", host=f"cpu/{host}").backend


def cases() -> list[tuple[Family, str]]:
    """Each family on this host ("native"), then on each CPU kind whose engine differs."""
    out = []
    for family in FAMILIES:
        seen = {picked(family, choice.host_kind("cpu").removeprefix("cpu/"))}
        out.append((family, "native"))
        for host in FLAGS:
            engine = picked(family, host)
            if engine not in seen:
                seen.add(engine)
                out.append((family, host))
    return out


CASES = cases()


def entry(family: Family, host: str) -> str:
    return f"{family.name}-{host}"


def params() -> list[Any]:
    return [pytest.param(f, h, id=entry(f, h)) for f, h in CASES]


@pytest.fixture(scope="module")
def directories(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("held-out")
    return {f.name: f.build(root / f.name) for f in FAMILIES}


@pytest.fixture(scope="module")
def server(directories: dict[str, Path], request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    from infinity_server.app import create_app
    from infinity_server.settings import ServerSettings, Settings
    from model_registry.config import registry_config

    models = [{"name": entry(f, h), "source": str(directories[f.name])} for f, h in CASES]
    settings = Settings(ServerSettings(admin_routes=True), registry_config({"models": models}))
    live = start_server(create_app(settings))
    # The engines' builds (a child process each) overlap: the selected entries of this host load
    # now, two at a time; those of a forced CPU kind load in their test, while it is forced.
    selected = {item.callspec.id for item in request.session.items if hasattr(item, "callspec")}
    natives = [entry(f, h) for f, h in CASES if h == "native" and entry(f, h) in selected]
    with live.client() as client, ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda name: client.post(f"/v1/models/{name}/load"), natives))
    yield live
    live.close()


# ---- references -----------------------------------------------------------------------------------


def sentence_transformer(directory: Path, family: Family) -> Any:
    from sentence_transformers import SentenceTransformer

    # e5-mistral's recipe ends each text with `</s>`, which its tokenizer_config asks for and
    # transformers 5 no longer applies from it (tokenizer.json wins): the flags restore it.
    flags = {"add_bos_token": True, "add_eos_token": True} if family.model_type == "mistral" else None
    return SentenceTransformer(str(directory), device="cpu", processor_kwargs=flags)


def st_vectors(model: Any, texts: list[str], prompt: str | None) -> np.ndarray:
    return np.asarray(model.encode(texts, prompt_name=prompt, convert_to_numpy=True), dtype=np.float64)


def ce_scores(directory: Path) -> np.ndarray:
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(directory), device="cpu")
    return np.asarray(model.predict([(QUERY, d) for d in DOCUMENTS]), dtype=np.float64)


def label_probabilities(directory: Path) -> np.ndarray:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModelForSequenceClassification.from_pretrained(str(directory)).eval()
    with torch.no_grad():
        logits = model(**tokenizer(TEXTS, padding=True, return_tensors="pt")).logits
    return torch.softmax(logits, dim=-1).numpy().astype(np.float64)


def splade_weights(directory: Path) -> list[dict[int, float]]:
    from sentence_transformers import SparseEncoder

    encoded = SparseEncoder(str(directory), device="cpu").encode(TEXTS, convert_to_tensor=True).to_dense()
    return [{int(i): float(row[i]) for i in torch.nonzero(row).flatten()} for row in encoded]


@functools.cache
def colbert_ai(directory: Path) -> tuple[Any, Any, torch.Tensor, dict[str, Any]]:
    """colbert-ai's checkpoint read as its `HF_ColBERT` does: the tokenizer, BERT, the projection."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    state = torch.load(directory / "pytorch_model.bin", weights_only=True)
    bert = BertModel(BertConfig.from_pretrained(str(directory))).eval()
    bert.load_state_dict({k.removeprefix("bert."): v for k, v in state.items() if k.startswith("bert.")})
    meta = json.loads((directory / "artifact.metadata").read_text())
    return AutoTokenizer.from_pretrained(str(directory)), bert, state["linear.weight"], meta


def colbert_ai_vectors(directory: Path, text: str, *, query: bool) -> np.ndarray:
    """colbert-ai's ColBERT: '. ' then its marker in the second position, [MASK] padding the
    query to `query_maxlen` (not attended), the document's punctuation dropped."""
    tokenizer, bert, linear, meta = colbert_ai(directory)
    padding = "max_length" if query else False
    length = meta["query_maxlen" if query else "doc_maxlen"]
    encoded = tokenizer(". " + text, padding=padding, truncation=True, max_length=length, return_tensors="pt")
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    ids[:, 1] = tokenizer.convert_tokens_to_ids(meta["query_token_id" if query else "doc_token_id"])
    if query:
        ids[ids == tokenizer.pad_token_id] = tokenizer.mask_token_id
        keep = torch.ones_like(ids[0], dtype=torch.bool)
    else:
        skip = {tokenizer.encode(p, add_special_tokens=False)[0] for p in string.punctuation}
        keep = torch.tensor([t not in skip for t in ids[0].tolist()])
    with torch.no_grad():
        vectors = bert(input_ids=ids, attention_mask=mask)[0] @ linear.T
    return torch.nn.functional.normalize(vectors, dim=-1)[0][keep].numpy().astype(np.float64)


# ---- what the server answers ----------------------------------------------------------------------


def post(client: Any, path: str, body: dict[str, Any]) -> Any:
    answer = client.post(path, json=body)
    assert answer.status_code == 200, f"{answer.status_code}: {answer.text}"
    return answer.json()


def served_vectors(client: Any, model: str, texts: list[str], prompt: str | None) -> np.ndarray:
    extra = {} if prompt is None else {"prompt_name": prompt}
    body = post(client, "/v1/embeddings", {"model": model, "input": texts, **extra})
    return np.asarray([row["embedding"] for row in body["data"]], dtype=np.float64)


def close_vectors(got: np.ndarray, expected: np.ndarray) -> None:
    """Equal within the tolerance relative to each expected vector's length (a model without
    Normalize answers vectors of any length); the largest gap in the message."""
    scale = np.linalg.norm(expected, axis=-1, keepdims=True)
    gap = float(np.abs(got / scale - expected / scale).max())
    assert gap <= TOLERANCE, f"largest difference {gap:.2e} (relative to the vector's length)"


def check_embed(client: Any, model: str, family: Family, directory: Path) -> None:
    """Vectors as `encode` gives them, batched equal to single, and a rerank scored as
    `SentenceTransformer.similarity` scores the query (its "query" prompt) against the documents
    (their "document" or "passage" prompt)."""
    reference = sentence_transformer(directory, family)
    got = served_vectors(client, model, TEXTS, family.prompt)
    close_vectors(got, st_vectors(reference, TEXTS, family.prompt))
    close_vectors(np.stack([served_vectors(client, model, [t], family.prompt)[0] for t in TEXTS]), got)
    prompts = reference.prompts
    query = st_vectors(reference, [QUERY], "query" if "query" in prompts else None)
    document_prompt = next((p for p in ("document", "passage") if p in prompts), None)
    documents = st_vectors(reference, DOCUMENTS, document_prompt)
    expected = reference.similarity(torch.from_numpy(query), torch.from_numpy(documents)).numpy()[0]
    body = post(client, "/rerank", {"model": model, "query": QUERY, "documents": DOCUMENTS})
    scores = {r["index"]: r["relevance_score"] for r in body["results"]}
    gap = max(abs(scores[i] - expected[i]) / max(1.0, abs(expected[i])) for i in range(len(DOCUMENTS)))
    assert gap <= TOLERANCE, f"rerank by {reference.similarity_fn_name}: largest difference {gap:.2e}"


def check_rerank(client: Any, model: str, family: Family, directory: Path) -> None:
    expected = ce_scores(directory)
    body = post(client, "/rerank", {"model": model, "query": QUERY, "documents": DOCUMENTS})
    got = np.asarray([{r["index"]: r["relevance_score"] for r in body["results"]}[i] for i in range(len(DOCUMENTS))])
    gap = float(np.abs(got - expected).max())
    assert gap <= TOLERANCE, f"scores {got.round(5).tolist()} against {expected.round(5).tolist()}"
    single = [post(client, "/rerank", {"model": model, "query": QUERY, "documents": [d]}) for d in DOCUMENTS]
    np.testing.assert_allclose([s["results"][0]["relevance_score"] for s in single], got, atol=TOLERANCE)


def check_classify(client: Any, model: str, family: Family, directory: Path) -> None:
    from transformers import AutoConfig

    labels = AutoConfig.from_pretrained(str(directory)).id2label
    expected = label_probabilities(directory)
    body = post(client, "/classify", {"model": model, "input": TEXTS})
    for row, answer in zip(expected, body["data"], strict=True):
        got = {a["label"]: a["score"] for a in answer}
        gap = max(abs(got[labels[i]] - row[i]) for i in range(len(row)))
        assert gap <= TOLERANCE, f"probabilities differ by {gap:.2e}"


def check_sparse(client: Any, model: str, family: Family, directory: Path) -> None:
    expected = splade_weights(directory)
    body = post(client, "/v1/encode", {"model": model, "input": TEXTS, "outputs": ["sparse"]})
    for want, answer in zip(expected, body["data"], strict=True):
        got = dict(zip(answer["sparse"]["indices"], answer["sparse"]["values"], strict=True))
        assert sorted(got) == sorted(want)
        gap = max(abs(got[i] - want[i]) for i in want)
        assert gap <= TOLERANCE, f"weights differ by {gap:.2e}"


def check_multivector(client: Any, model: str, family: Family, directory: Path) -> None:
    for query in (True, False):
        extra = {"prompt_name": "query"} if query else {}
        body = post(client, "/v1/encode", {"model": model, "input": TEXTS, "outputs": ["multivector"], **extra})
        for text, answer in zip(TEXTS, body["data"], strict=True):
            expected = colbert_ai_vectors(directory, text, query=query)
            got = np.asarray(answer["multivector"], dtype=np.float64)
            assert got.shape == expected.shape, f"{'query' if query else 'document'} {text!r}"
            gap = float(np.abs(got - expected).max())
            assert gap <= TOLERANCE, f"{'query' if query else 'document'} vectors differ by {gap:.2e}"


CHECKS: dict[str, Callable[[Any, str, Family, Path], None]] = {
    "embed": check_embed,
    "rerank": check_rerank,
    "classify": check_classify,
    "sparse": check_sparse,
    "multivector": check_multivector,
}


@pytest.mark.parametrize(("family", "host"), params())
def test_held_out_family_matches_its_reference(
    server: LiveServer, directories: dict[str, Path], family: Family, host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if host != "native":
        monkeypatch.setattr(choice, "cpu_flags", lambda: frozenset(FLAGS[host]))
    expected_engine = picked(family, choice.host_kind("cpu").removeprefix("cpu/"))
    model = entry(family, host)
    with server.client() as client:
        CHECKS[family.check](client, model, family, directories[family.name])
        described = client.get(f"/v1/models/{model}").json()
    engine = described["details"]["engine"]
    assert described["backend"] == expected_engine, engine["reason"]
