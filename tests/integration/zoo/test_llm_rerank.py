"""LLM rerankers in their original format over HTTP: a causal LM scored by its yes/no logits.

The reference is transformers' own full forward (AutoModelForCausalLM, the whole vocabulary's
logits) on the text as each model card formats the pair, written out here independently of the
server's records; and sentence-transformers 6's CrossEncoder where it reads the layout (a chat
template with query/document roles).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.builders.llm_rerankers import (
    tiny_gemma_reranker,
    tiny_mxbai_reranker,
    tiny_qwen3_reranker,
    with_chat_template,
)

pytestmark = pytest.mark.integration

QUERY = "Which animal sleeps on the windowsill?"
DOCUMENTS = [
    "The cat sleeps on the warm windowsill.",
    "The stock market fell sharply on Monday.",
    "Two dogs are running through the snow.",
    "A plane is taking off from the airport, and the children are playing football in the park.",
    "yes",
]
QWEN3_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


def qwen3_card(query: str, document: str, instruction: str = QWEN3_INSTRUCTION) -> str:
    """Qwen3-Reranker's model card: prefix + format_instruction(...) + suffix."""
    prefix = (
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
        'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    )
    suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    return f"{prefix}<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}{suffix}"


def gemma_card(query: str, document: str) -> str:
    """bge-reranker-v2-gemma's prompt as one text (what the server sent before it tokenized in pieces)."""
    return f"<bos>A: {query}\nB: {document}\n{GEMMA_PROMPT}"


GEMMA_PROMPT = (
    "Given a query A and a passage B, determine whether the passage contains an answer to the query by "
    "providing a prediction of either 'Yes' or 'No'."
)


def flag_llm_reranker(directory: Path, query: str, documents: list[str]) -> np.ndarray:
    """FlagEmbedding's `FlagLLMReranker.compute_score` (its source; the package does not import
    under transformers 5): [bos] + ids("A: " + query) + ids("\n") + ids("B: " + passage) + ids("\n")
    + ids(prompt), each tokenized alone, scored by the logit of the first token of "Yes"."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()

    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    yes = ids("Yes")[0]
    logits = []
    with torch.inference_mode():
        for document in documents:
            joined = [tokenizer.bos_token_id, *ids(f"A: {query}"), *ids("\n"), *ids(f"B: {document}")]
            joined += ids("\n") + ids(GEMMA_PROMPT)
            logits.append(float(model(input_ids=torch.tensor([joined])).logits[0, -1, yes]))
    return np.asarray(logits)


def mxbai_card(query: str, document: str, instruction: str | None = None) -> str:
    """mxbai-rerank-v2's prompt as one text (what the server sent before it tokenized in pieces)."""
    prefix = (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n"
    )
    head = f"instruction: {instruction}\n" if instruction else ""
    return f"{prefix}{head}query: {query}\ndocument: {document}\n{MXBAI_TASK}<|im_end|>\n<|im_start|>assistant\n"


MXBAI_TASK = (
    "You are a search relevance expert who evaluates how well documents match search queries. For each "
    "query-document pair, carefully analyze the semantic relationship between them, then provide your "
    "binary relevance judgment (0 for not relevant, 1 for relevant).\nRelevance:"
)


def mxbai_rerank_v2(directory: Path, query: str, documents: list[str], instruction: str | None = None) -> np.ndarray:
    """The mxbai-rerank package's `MxbaiRerankV2.predict` (its source; the package calls the
    tokenizer's `prepare_for_model`, which transformers 5 removed): ids(chat prefix) +
    ids(["instruction: I\n"] + "query: Q") + ids("\n") + ids("document: D") + ids("\n") + ids(task)
    + ids(chat suffix), scored by the logit of the first token of "1" less that of "0"."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()

    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    prefix = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    prefix += "<|im_start|>user\n"
    task = MXBAI_TASK
    head = f"instruction: {instruction}\n" if instruction else ""
    yes, no = ids("1")[0], ids("0")[0]
    logits = []
    with torch.inference_mode():
        for document in documents:
            joined = ids(prefix) + ids(f"{head}query: {query}") + ids("\n") + ids(f"document: {document}")
            joined += ids("\n") + ids(task) + ids("<|im_end|>\n<|im_start|>assistant\n")
            last = model(input_ids=torch.tensor([joined])).logits[0, -1]
            logits.append(float(last[yes] - last[no]))
    return np.asarray(logits)


def sigmoid(values: np.ndarray) -> np.ndarray:
    return np.asarray(1 / (1 + np.exp(-values)))


def reference(directory: Path, texts: list[str], true: str, false: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(p(true), log-odds) per text from the full forward of each text alone (no padding)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    rows = [tokenizer.convert_tokens_to_ids(t) for t in (true, false) if t is not None]
    probabilities, odds = [], []
    with torch.inference_mode():
        for text in texts:
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")
            last = model(**ids).logits[0, -1]
            if false is None:
                probabilities.append(float(torch.sigmoid(last[rows[0]])))
                odds.append(float(last[rows[0]]))
            else:
                two = torch.stack([last[rows[1]], last[rows[0]]])  # [no, yes] as the card stacks them
                probabilities.append(float(torch.softmax(two, dim=0)[1]))
                odds.append(float(last[rows[0]] - last[rows[1]]))
    return np.asarray(probabilities), np.asarray(odds)


def entry(directory: Path, **extra: Any) -> dict[str, Any]:
    return {"name": "llm", "source": str(directory), "kind": "reranker", "dtype": "float32", **extra}


def scores(answer: Any) -> list[float]:
    assert answer.status_code == 200, answer.text
    by_index = {r["index"]: r["relevance_score"] for r in answer.json()["results"]}
    return [by_index[i] for i in range(len(by_index))]


def rerank(client: Any, documents: list[str], path: str = "/rerank", **extra: Any) -> list[float]:
    body = {"model": "llm", "query": QUERY, "documents": documents, **extra}
    return scores(client.post(path, json=body))


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_qwen3_reranker(tmp_path_factory.mktemp("qwen3-reranker"))


def test_qwen3_reranker_scores_p_yes_as_its_model_card(serve: Any, qwen3_dir: Path) -> None:
    texts = [qwen3_card(QUERY, d) for d in DOCUMENTS]
    expected, odds = reference(qwen3_dir, texts, "yes", "no")
    assert np.ptp(expected) > 1e-3  # the scores differ enough for the comparison to mean something
    live = serve({"models": [entry(qwen3_dir)]})
    with live.client() as client:
        got = rerank(client, DOCUMENTS)
        cohere = rerank(client, DOCUMENTS, "/v1/rerank")
        raw = rerank(client, DOCUMENTS, raw_scores=True)
        single = [rerank(client, [d])[0] for d in DOCUMENTS]
        described = {m["id"]: m for m in client.get("/v1/models").json()["data"]}["llm"]
    np.testing.assert_allclose(got, expected, atol=1e-4)
    np.testing.assert_allclose(cohere, expected, atol=1e-4)
    np.testing.assert_allclose(raw, odds, atol=1e-4)
    np.testing.assert_allclose(single, got, atol=1e-5)
    assert "qwen3-reranker" in str(described)


def test_right_padding_scores_the_last_real_token(serve: Any, tmp_path: Path) -> None:
    directory = tiny_qwen3_reranker(tmp_path / "right", padding_side="right")
    expected, _ = reference(directory, [qwen3_card(QUERY, d) for d in DOCUMENTS], "yes", "no")
    live = serve({"models": [entry(directory)]})
    with live.client() as client:
        np.testing.assert_allclose(rerank(client, DOCUMENTS), expected, atol=1e-4)


def test_a_request_instruction_changes_the_score_as_the_reference(serve: Any, qwen3_dir: Path) -> None:
    instruction = "Find the passage about animals"
    expected, _ = reference(qwen3_dir, [qwen3_card(QUERY, d, instruction) for d in DOCUMENTS], "yes", "no")
    default, _ = reference(qwen3_dir, [qwen3_card(QUERY, d) for d in DOCUMENTS], "yes", "no")
    assert np.abs(expected - default).max() > 1e-3
    live = serve({"models": [entry(qwen3_dir)]})
    with live.client() as client:
        infinity = rerank(client, DOCUMENTS, instruction=instruction)
        cohere = rerank(client, DOCUMENTS, "/v1/rerank", instruction=instruction)
        assert client.get("/health").status_code == 200
    np.testing.assert_allclose(infinity, expected, atol=1e-4)
    np.testing.assert_allclose(cohere, expected, atol=1e-4)


def test_the_configured_instruction_is_the_default(serve: Any, qwen3_dir: Path) -> None:
    instruction = "Judge relevance to pets"
    expected, _ = reference(qwen3_dir, [qwen3_card(QUERY, d, instruction) for d in DOCUMENTS], "yes", "no")
    live = serve({"models": [entry(qwen3_dir, instruction=instruction)]})
    with live.client() as client:
        np.testing.assert_allclose(rerank(client, DOCUMENTS), expected, atol=1e-4)


def test_bge_reranker_v2_gemma_scores_the_yes_logit_as_flag_embedding(serve: Any, tmp_path: Path) -> None:
    directory = tiny_gemma_reranker(tmp_path / "gemma")
    odds = flag_llm_reranker(directory, QUERY, DOCUMENTS)
    assert np.ptp(odds) > 1e-2
    # The query ends in "?" and the tokenizer merges "?\n": the prompt tokenized whole scores otherwise.
    _, whole = reference(directory, [gemma_card(QUERY, d) for d in DOCUMENTS], "Yes", None)
    assert np.abs(whole - odds).max() > 1e-3
    live = serve({"models": [entry(directory)]})
    with live.client() as client:
        got = rerank(client, DOCUMENTS)
        raw = rerank(client, DOCUMENTS, raw_scores=True)
        single = [rerank(client, [d])[0] for d in DOCUMENTS[:3]]
    np.testing.assert_allclose(got, sigmoid(odds), atol=1e-4)
    np.testing.assert_allclose(raw, odds, atol=1e-4)
    np.testing.assert_allclose(single, got[:3], atol=1e-5)


def test_mxbai_rerank_v2_scores_as_its_reference_with_and_without_instruction(serve: Any, tmp_path: Path) -> None:
    directory = tiny_mxbai_reranker(tmp_path / "mxbai")
    instruction = "Rank pets first."
    odds = mxbai_rerank_v2(directory, QUERY, DOCUMENTS)
    instructed = mxbai_rerank_v2(directory, QUERY, DOCUMENTS, instruction)
    assert np.abs(odds - instructed).max() > 1e-3
    _, whole = reference(directory, [mxbai_card(QUERY, d, instruction) for d in DOCUMENTS], "1", "0")
    assert np.abs(whole - instructed).max() > 1e-3  # "?\n" and ".\n" merge when tokenized whole
    live = serve({"models": [entry(directory)]})
    with live.client() as client:
        np.testing.assert_allclose(rerank(client, DOCUMENTS, raw_scores=True), odds, atol=1e-4)
        np.testing.assert_allclose(rerank(client, DOCUMENTS), sigmoid(odds), atol=1e-4)
        got = rerank(client, DOCUMENTS, raw_scores=True, instruction=instruction)
        np.testing.assert_allclose(got, instructed, atol=1e-4)


@pytest.mark.slow
def test_a_chat_template_with_pair_roles_matches_sentence_transformers(serve: Any, tmp_path: Path) -> None:
    """The files say it is a reranker (no `kind:` needed), and it reads as sentence-transformers reads it."""
    from sentence_transformers import CrossEncoder

    directory = with_chat_template(tiny_qwen3_reranker(tmp_path / "chat"))
    model = CrossEncoder(str(directory), device="cpu")
    expected = np.asarray(model.predict([(QUERY, d) for d in DOCUMENTS]), dtype=np.float64)
    instruction = "Find the passage about animals"
    instructed = np.asarray(model.predict([(QUERY, d) for d in DOCUMENTS], prompt=instruction), dtype=np.float64)
    messages = [[{"role": "query", "content": QUERY}, {"role": "document", "content": d}] for d in DOCUMENTS]
    texts = [str(model.tokenizer.apply_chat_template(m, tokenize=False)) for m in messages]
    transformers_expected, _ = reference(directory, texts, "yes", "no")
    np.testing.assert_allclose(expected, transformers_expected, atol=1e-5)
    live = serve({"models": [{"name": "llm", "source": str(directory), "dtype": "float32"}]})
    with live.client() as client:
        np.testing.assert_allclose(rerank(client, DOCUMENTS), expected, atol=1e-4)
        np.testing.assert_allclose(rerank(client, DOCUMENTS, instruction=instruction), instructed, atol=1e-4)


def test_a_configured_template_and_tokens_override_the_record(serve: Any, qwen3_dir: Path) -> None:
    template = "Query: {query}\nDocument: {document}\nRelevant (1 or 0):"
    texts = [f"Query: {QUERY}\nDocument: {d}\nRelevant (1 or 0):" for d in DOCUMENTS]
    expected, _ = reference(qwen3_dir, texts, "1", "0")
    live = serve({"models": [entry(qwen3_dir, template=template, true_token="1", false_token="0")]})
    with live.client() as client:
        np.testing.assert_allclose(rerank(client, DOCUMENTS), expected, atol=1e-4)
        refused = client.post("/rerank", json={"model": "llm", "query": QUERY, "documents": ["a"], "instruction": "x"})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "instruction"


def test_an_over_long_pair_keeps_the_prompt_frame_or_is_refused(serve: Any, tmp_path: Path) -> None:
    directory = tiny_qwen3_reranker(tmp_path / "short", max_length=96)
    long_document = " ".join(DOCUMENTS * 6)
    live = serve({"models": [entry(directory)]})
    with live.client() as client:
        cut = rerank(client, [long_document, DOCUMENTS[0]])
        refused = client.post(
            "/rerank", json={"model": "llm", "query": QUERY, "documents": [long_document], "truncate": False}
        )
    assert all(0.0 < s < 1.0 for s in cut)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "input_too_long"


def test_the_original_format_is_never_served_as_a_dense_embedder(serve: Any, qwen3_dir: Path) -> None:
    """Without `kind: reranker`, a causal LM without sentence-transformers modules is refused,
    naming the settings; it is not answered with cosine scores of last-token vectors."""
    live = serve({"models": [{"name": "llm", "source": str(qwen3_dir)}]})
    with live.client() as client:
        ranked = client.post("/rerank", json={"model": "llm", "query": QUERY, "documents": DOCUMENTS})
        embedded = client.post("/v1/embeddings", json={"model": "llm", "input": ["a cat"]})
        assert client.get("/health").status_code == 200
    for answer in (ranked, embedded):
        assert answer.status_code == 503, answer.text
        message = answer.json()["error"]["message"]
        assert "Qwen3ForCausalLM" in message
        assert "kind: reranker" in message
        assert "pooling: lasttoken" in message


@pytest.mark.parametrize("backend", ["onnx", "ctranslate2"])
def test_a_converting_engine_is_refused_at_start_naming_torch(qwen3_dir: Path, backend: str) -> None:
    from model_registry import Registry
    from model_registry.config import registry_config
    from model_registry.errors import ConfigError

    config = registry_config({"models": [entry(qwen3_dir, backend=backend)]})
    with pytest.raises(ConfigError, match=r"model 'llm': an LLM reranker .* backend: torch"):
        Registry(config)


def test_an_instruction_to_a_cross_encoder_is_a_clear_400(serve: Any, tmp_path: Path) -> None:
    from tests.builders.zoo import tiny_cross_encoder

    directory = tiny_cross_encoder(tmp_path / "ce")
    live = serve({"models": [{"name": "ce", "source": str(directory), "backend": "torch"}]})
    with live.client() as client:
        body = {"model": "ce", "query": QUERY, "documents": DOCUMENTS, "instruction": "x"}
        answer = client.post("/rerank", json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "instruction"


@pytest.mark.slow
def test_qwen3_embedding_with_its_modules_is_still_a_dense_embedder(serve: Any, tmp_path: Path) -> None:
    """`Qwen3ForCausalLM` in config.json, sentence-transformers modules beside it: dense, as they say."""
    from sentence_transformers import SentenceTransformer

    from tests.builders.llm_rerankers import tiny_qwen3_embedding

    directory = tiny_qwen3_embedding(tmp_path / "qwen3-embedding")
    expected = SentenceTransformer(str(directory), device="cpu").encode(DOCUMENTS)
    live = serve({"models": [{"name": "emb", "source": str(directory), "dtype": "float32"}]})
    with live.client() as client:
        answer = client.post("/v1/embeddings", json={"model": "emb", "input": DOCUMENTS})
    assert answer.status_code == 200, answer.text
    got = np.asarray([row["embedding"] for row in answer.json()["data"]])
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_an_instruction_is_held_to_max_input_chars_and_priced(serve: Any, qwen3_dir: Path) -> None:
    """An instruction is a text like any other: over `max_input_chars` a 400 before any work, and
    counted in the pair's price, so a long one is tokenized off the event loop."""
    from model_registry.runtime.admission import price, tokenizing_price
    from model_registry.runtime.worker import INLINE_COST
    from model_registry.types import PairItem

    live = serve({"max_input_chars": 2000, "models": [entry(qwen3_dir)]})
    body = {"model": "llm", "query": QUERY, "documents": DOCUMENTS[:2]}
    with live.client() as client:
        refused = client.post("/rerank", json={**body, "instruction": "pets " * 401})
        near = client.post("/rerank", json={**body, "instruction": "pets " * 399})
        assert client.get("/health").status_code == 200
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "instruction"
    assert "max_input_chars" in refused.json()["error"]["message"]
    assert near.status_code == 200, near.text
    plain, instructed = PairItem("q", "d"), PairItem("q", "d", instruction="pets " * 400)
    assert price([instructed], None) >= price([plain], None) + 2000 // 4
    assert tokenizing_price([instructed]) > INLINE_COST
