"""Tiny random models built here, loaded through the real loading code, against sentence-transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from model_registry import SyncRegistry
from model_registry.types import Embedding, Result
from tests.builders.text import CORPUS, tiny_bert, tiny_qwen2

TEXTS = [*CORPUS, "short", "a somewhat longer sentence with several more words than the others in here"]


def dense(result: Result) -> np.ndarray:
    assert isinstance(result, Embedding)
    assert result.dense is not None
    return result.dense


def embed(directory: Path, texts: list[str], **spec: Any) -> np.ndarray:
    config = {"models": [{"name": "m", "source": str(directory), "pin": True, "backend": "torch", **spec}]}
    with SyncRegistry.from_config(config) as registry:
        results = registry.embed("m", texts)
    return np.stack([dense(r) for r in results.items])


def reference(directory: Path, texts: list[str], **kwargs: Any) -> np.ndarray:
    model = SentenceTransformer(str(directory), device="cpu")
    return np.asarray(model.encode(texts, batch_size=4, convert_to_numpy=True, **kwargs))


@pytest.mark.parametrize("pooling", ["cls", "mean", "max", "lasttoken", "weightedmean", "mean_sqrt_len_tokens"])
def test_bert_pooling_matches_sentence_transformers(tmp_path: Path, pooling: str) -> None:
    directory = tiny_bert(tmp_path / "bert", pooling=pooling, normalize=pooling != "max")
    ours, theirs = embed(directory, TEXTS), reference(directory, TEXTS)
    assert ours.shape == theirs.shape == (len(TEXTS), 32)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_dense_layer_matches_sentence_transformers(tmp_path: Path) -> None:
    directory = tiny_bert(tmp_path / "bert", dense=(16, "torch.nn.modules.activation.Tanh"))
    ours, theirs = embed(directory, TEXTS), reference(directory, TEXTS)
    assert ours.shape == (len(TEXTS), 16)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_decoder_last_token_matches_sentence_transformers(tmp_path: Path, padding_side: str) -> None:
    directory = tiny_qwen2(tmp_path / "qwen", padding_side=padding_side)
    ours, theirs = embed(directory, TEXTS), reference(directory, TEXTS)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    # The same text alone and inside a padded batch gives the same vector.
    alone = embed(directory, [TEXTS[-1]])
    np.testing.assert_allclose(alone[0], ours[-1], atol=1e-5)


def test_plain_transformers_decoder_defaults_to_last_token(tmp_path: Path) -> None:
    directory = tiny_qwen2(tmp_path / "qwen", st=False)
    ours = embed(directory, TEXTS[:3])
    st_directory = tiny_qwen2(tmp_path / "qwen-st")
    np.testing.assert_allclose(ours, reference(st_directory, TEXTS[:3]), atol=1e-5)


def test_prompts_match_sentence_transformers(tmp_path: Path) -> None:
    prompts = {"query": "query: ", "document": "passage: "}
    directory = tiny_bert(tmp_path / "bert", prompts=prompts)
    model = SentenceTransformer(str(directory), device="cpu")
    config = {"models": [{"name": "m", "source": str(directory), "pin": True, "backend": "torch"}]}
    with SyncRegistry.from_config(config) as registry:
        ours = registry.embed("m", TEXTS[:4], prompt_name="query")
    theirs = model.encode(TEXTS[:4], prompt_name="query")
    np.testing.assert_allclose(np.stack([dense(r) for r in ours.items]), theirs, atol=1e-5)


def test_prompt_excluded_from_pooling_matches_sentence_transformers(tmp_path: Path) -> None:
    directory = tiny_bert(tmp_path / "bert", prompts={"query": "query: "}, include_prompt=False)
    model = SentenceTransformer(str(directory), device="cpu")
    config = {"models": [{"name": "m", "source": str(directory), "pin": True, "backend": "torch"}]}
    with SyncRegistry.from_config(config) as registry:
        ours = registry.embed("m", TEXTS[:4], prompt_name="query")
    theirs = model.encode(TEXTS[:4], prompt_name="query")
    np.testing.assert_allclose(np.stack([dense(r) for r in ours.items]), theirs, atol=1e-5)
