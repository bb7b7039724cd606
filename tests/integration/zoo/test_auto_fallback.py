"""`backend: auto` hands a model that its first engine cannot build over to the next engine, torch
last, and says so in `/models`; an engine that was configured gets no such second chance.

The model: a BERT embedder whose activation (`mish`) transformers and the ONNX export run and
CTranslate2's converter does not know; compared with sentence-transformers on the same weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_registry.backends import choice
from tests.builders.text import tiny_bert

pytestmark = pytest.mark.integration

TEXTS = ["The cat sleeps on the warm windowsill.", "Two dogs run through the snow.", "a"]
#: CPU kind -> the flags that mark it, and the engine that serves the model after CTranslate2
#: fails: the next one of `auto`'s list for that kind (docs/backends.md, "How to pick").
HOSTS = {"avx2": ({"avx2"}, "torch"), "avx512_vnni": ({"avx2", "avx512_vnni"}, "onnx")}


@pytest.fixture(scope="module")
def mish_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tiny_bert(tmp_path_factory.mktemp("mish"))
    config = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**config, "hidden_act": "mish"}))
    return root


@pytest.fixture(scope="module")
def expected(mish_dir: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return np.asarray(SentenceTransformer(str(mish_dir), device="cpu").encode(TEXTS))


def embed(client: Any, texts: list[str]) -> np.ndarray:
    answer = client.post("/v1/embeddings", json={"model": "m", "input": texts})
    assert answer.status_code == 200, answer.text
    return np.asarray([row["embedding"] for row in answer.json()["data"]])


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_auto_falls_back_past_an_engine_that_cannot_build_the_model(
    serve: Any, mish_dir: Path, expected: np.ndarray, host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags, engine = HOSTS[host]
    monkeypatch.setattr(choice, "cpu_flags", lambda: frozenset(flags))
    assert choice.choose("m", "auto", "none", "dense", {"model_type": "bert"}, "cpu").backend == "ctranslate2"
    live = serve({"models": [{"name": "m", "source": str(mish_dir)}]})
    with live.client() as client:
        np.testing.assert_allclose(embed(client, TEXTS), expected, atol=1e-4)
        described = client.get("/v1/models/m").json()
    assert described["backend"] == engine, described
    reason = described["details"]["engine"]["reason"]
    assert reason.startswith(f"auto: {engine}, "), reason
    assert "ctranslate2 could not serve it" in reason, reason
    assert "mish" in reason, reason


def test_a_configured_engine_that_cannot_build_the_model_is_refused(serve: Any, mish_dir: Path) -> None:
    live = serve({"models": [{"name": "m", "source": str(mish_dir), "backend": "ctranslate2"}]})
    with live.client() as client:
        answer = client.post("/v1/embeddings", json={"model": "m", "input": ["a"]})
    assert answer.status_code == 503, answer.text
    assert "ctranslate2" in answer.text, answer.text
    assert "mish" in answer.text, answer.text
