"""TEI's `/predict` with pairs on a classifier (an NLI model's premise and hypothesis), against
transformers on the same tiny weights: each pair reads as `tokenizer(text, text_pair)`, cut as
the tokenizer cuts it, and a batch may mix texts and pairs.

`InferenceClient.text_classification` sends one string, never a pair: these tests speak HTTP.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.builders.text import CORPUS
from tests.builders.zoo import tiny_cross_encoder
from tests.conftest import LiveServer, start_server

pytestmark = pytest.mark.integration

LABELS = ("contradiction", "entailment", "neutral")
LIMIT = 128  # the tiny model's tokens
MAX_CHARS = 1500
TOLERANCE = 1e-4


def _sentences(start: int, count: int) -> str:
    return " ".join(CORPUS[(start + i) % len(CORPUS)] for i in range(count))


SHORT = [("A man is playing a guitar.", "A man plays music."), ("Two dogs run in the snow.", "The cat sleeps.")]
LONG = [
    (_sentences(0, 12), _sentences(5, 12)),  # both over half the limit: both texts lose tokens
    ("Two dogs run.", _sentences(3, 25)),  # the second text alone is cut
    (_sentences(7, 25), "A plane takes off."),  # the first text alone is cut
]


@pytest.fixture(scope="module")
def nli(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("nli") / "nli"
    return tiny_cross_encoder(root, labels=3, seed=2, names=LABELS, initializer_range=0.3, segment_ids=True)


@pytest.fixture(scope="module")
def server(nli: Path) -> Iterator[LiveServer]:
    from infinity_server.app import create_app
    from infinity_server.settings import ServerSettings, Settings
    from model_registry.config import registry_config

    entry = {"name": "nli", "source": str(nli), "backend": "torch"}
    registry = registry_config({"models": [entry], "max_input_chars": MAX_CHARS})
    live = start_server(create_app(Settings(ServerSettings(), registry)))
    yield live
    live.close()


def reference(directory: Path, inputs: Sequence[Sequence[str]], side: str = "right") -> np.ndarray:
    """transformers' logits per input, each tokenized alone as `tokenizer(*input, truncation=True)`."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory), truncation_side=side)
    model = AutoModelForSequenceClassification.from_pretrained(str(directory)).eval()
    assert tuple(model.config.id2label[i] for i in range(3)) == LABELS
    with torch.no_grad():
        rows = [model(**tokenizer(*texts, truncation=True, return_tensors="pt")).logits[0] for texts in inputs]
    logits: np.ndarray = torch.stack(rows).numpy()
    return logits


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    out: np.ndarray = shifted / shifted.sum(axis=-1, keepdims=True)
    return out


def predict(server: LiveServer, body: dict[str, Any], path: str = "/predict") -> Any:
    with server.client() as client:
        response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def refusal(server: LiveServer, body: dict[str, Any]) -> str:
    with server.client() as client:
        response = client.post("/predict", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error_type"] == "Validation"
    message: str = response.json()["error"]
    return message


def scores(rows: Sequence[Sequence[dict[str, Any]]]) -> np.ndarray:
    """Each answered row's scores in the model's label order, after checking it is best first."""
    for row in rows:
        ranked = [r["score"] for r in row]
        assert ranked == sorted(ranked, reverse=True)
    return np.asarray([[{r["label"]: r["score"] for r in row}[name] for name in LABELS] for row in rows])


def test_pairs_are_classified_as_transformers_reads_text_and_text_pair(server: LiveServer, nli: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(nli))
    assert all(len(tokenizer(a, b)["input_ids"]) > LIMIT for a, b in LONG)  # so each long pair is cut
    assert 1 in tokenizer(*SHORT[0])["token_type_ids"]  # so the second text's segment is read
    pairs = SHORT + LONG
    logits = reference(nli, pairs)
    batch = predict(server, {"inputs": [list(p) for p in pairs]})
    raw = predict(server, {"inputs": [list(p) for p in pairs], "raw_scores": True})
    alone = [predict(server, {"inputs": list(p)}) for p in pairs]  # one pair: one list of labels
    np.testing.assert_allclose(scores(batch), softmax(logits), atol=TOLERANCE)
    np.testing.assert_allclose(scores(raw), logits, atol=TOLERANCE)
    np.testing.assert_allclose(scores(alone), scores(batch), atol=1e-5)  # fp32: padding changes the sums
    top = predict(server, {"inputs": list(SHORT[0]), "top_k": 1})
    assert top == [max(alone[0], key=lambda r: r["score"])]


def test_left_truncation_cuts_the_start_of_a_pairs_texts(server: LiveServer, nli: Path) -> None:
    logits = reference(nli, LONG, side="left")
    left = predict(server, {"inputs": [list(p) for p in LONG], "truncation_direction": "Left", "raw_scores": True})
    np.testing.assert_allclose(scores(left), logits, atol=TOLERANCE)
    assert not np.allclose(logits, reference(nli, LONG), atol=1e-3)  # the side changes these pairs' answers


def test_a_batch_mixes_texts_and_pairs_each_read_on_its_own(server: LiveServer, nli: Path) -> None:
    inputs = [[SHORT[0][0]], list(SHORT[0]), [LONG[2][0]], list(LONG[1]), [SHORT[1][1]]]
    logits = reference(nli, inputs)
    mixed = predict(server, {"inputs": inputs, "raw_scores": True})
    text = predict(server, {"inputs": SHORT[0][0], "raw_scores": True})
    by_root = predict(server, {"inputs": list(SHORT[0]), "raw_scores": True}, path="/models/nli")
    np.testing.assert_allclose(scores(mixed), logits, atol=TOLERANCE)
    np.testing.assert_allclose(scores([text]), logits[:1], atol=TOLERANCE)
    np.testing.assert_allclose(scores(by_root), logits[1:2], atol=1e-6)  # the Inference API's batch shape


def test_each_text_of_a_pair_is_bounded_as_a_single_text_is(server: LiveServer) -> None:
    too_long = refusal(server, {"inputs": [list(SHORT[0]), list(LONG[0])], "truncate": False})
    assert "input 1 has" in too_long
    assert "its two texts together" in too_long
    assert f"limit of {LIMIT}" in too_long
    assert predict(server, {"inputs": [list(p) for p in SHORT], "truncate": False})
    assert "input 1 is empty" in refusal(server, {"inputs": [list(SHORT[0]), ["a premise", " "]]})
    over = "word " * (MAX_CHARS // 5) + "x"
    assert f"input 0 has {len(over):,} characters" in refusal(server, {"inputs": ["a premise", over]})
    # Two texts of up to the limit each are one pair, as two single texts would be two inputs.
    assert predict(server, {"inputs": ["word " * (MAX_CHARS // 5), "word " * (MAX_CHARS // 5)]})


async def test_a_pairs_tokens_count_both_texts(nli: Path) -> None:
    from transformers import AutoTokenizer

    from model_registry import Registry

    tokenizer = AutoTokenizer.from_pretrained(str(nli))
    expected = len(tokenizer(*SHORT[0])["input_ids"]) + len(tokenizer(SHORT[1][0])["input_ids"]) + LIMIT
    config = {"models": [{"name": "nli", "source": str(nli), "backend": "torch"}]}
    async with Registry.from_config(config) as registry:
        result = await registry.classify("nli", [list(SHORT[0]), SHORT[1][0], list(LONG[0])])
    assert result.tokens == expected
    assert len(result.results) == 3
