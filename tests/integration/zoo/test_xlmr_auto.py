"""XLM-R dense embedders (multilingual-e5, snowflake-arctic-embed-l-v2.0 layouts) on every engine
`auto` may pick, with the CPU kind forced so that the choice itself is tested, and with no
`backend` key at all; against sentence-transformers on the same weights.

CTranslate2's converter loads XLM-R as a sequence classifier; an embedder has no classifier head,
and the converter never reads one, so its absence is no reason to refuse the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_registry.backends import choice
from tests.builders.embedders import tiny_xlmr

pytestmark = pytest.mark.integration

TEXTS = ["query: how much protein should a female eat?", "passage: As a general guideline, 46 grams a day.", "a"]
#: The CPU kinds `auto` tells apart, by the flags that mark them.
HOSTS = {"avx2": {"avx2"}, "avx512_vnni": {"avx2", "avx512_vnni"}, "amx": {"avx2", "avx512_vnni", "amx_tile"}}
#: The engine `auto` picks for an fp32 XLM-R embedder on each (docs/backends.md, "How to pick").
PICKED = {"avx2": "ctranslate2", "avx512_vnni": "ctranslate2", "amx": "torch"}


@pytest.fixture(scope="module")
def xlmr_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_xlmr(tmp_path_factory.mktemp("xlmr"))


@pytest.fixture(scope="module")
def expected(xlmr_dir: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return np.asarray(SentenceTransformer(str(xlmr_dir), device="cpu").encode(TEXTS))


def embed(client: Any, texts: list[str]) -> np.ndarray:
    answer = client.post("/v1/embeddings", json={"model": "e5", "input": texts})
    assert answer.status_code == 200, answer.text
    return np.asarray([row["embedding"] for row in answer.json()["data"]])


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_no_backend_key_serves_xlmr_on_every_cpu_kind(
    serve: Any, xlmr_dir: Path, expected: np.ndarray, host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(choice, "cpu_flags", lambda: frozenset(HOSTS[host]))
    live = serve({"models": [{"name": "e5", "source": str(xlmr_dir)}]})
    with live.client() as client:
        got = embed(client, TEXTS)
        single = [embed(client, [t])[0] for t in TEXTS]
        described = client.get("/v1/models/e5").json()
    np.testing.assert_allclose(got, expected, atol=1e-4)
    np.testing.assert_allclose(single, got, atol=1e-5)
    assert described["backend"] == PICKED[host]
