"""Ranking helpers: method choice, ordering, top_n, softmax, input checks."""

from __future__ import annotations

import numpy as np
import pytest

from model_registry.classify import classification
from model_registry.errors import BatchFailed, InvalidInput, UnsupportedOperation
from model_registry.ranking import COSINE, check_rerank_input, embedding_scores, ranking, rerank_method
from model_registry.similarity import sparse_dot
from model_registry.types import Capability, Embedding, Labels, SparseVector


def test_method_follows_capabilities() -> None:
    assert rerank_method(frozenset({Capability.RERANK}), "m") == "cross-encoder"
    both = frozenset({Capability.EMBED_TEXT, Capability.SPARSE, Capability.MULTIVECTOR})
    assert rerank_method(both, "m") == "maxsim"
    assert rerank_method(frozenset({Capability.EMBED_TEXT}), "m") == "cosine"
    assert rerank_method(frozenset({Capability.SPARSE}), "m") == "sparse-dot"
    with pytest.raises(UnsupportedOperation, match="classify"):
        rerank_method(frozenset({Capability.CLASSIFY}), "m")


def test_ranking_orders_by_score_then_index_and_cuts_at_top_n() -> None:
    result = ranking(["a", "b", "c", "d"], [0.1, 0.9, 0.9, 0.5], 3, "cosine", 7)
    assert [(r.index, r.document) for r in result.results] == [(1, "b"), (2, "c"), (3, "d")]
    assert (result.method, result.tokens) == ("cosine", 7)


def test_classification_is_a_softmax_unless_raw() -> None:
    logits = np.array([1.0, 3.0, 0.0], np.float32)
    (row,) = classification([Labels(logits, ("a", "b", "c"))], False, 3).results
    expected = np.exp(logits) / np.exp(logits).sum()
    assert [s.label for s in row] == ["b", "a", "c"]
    np.testing.assert_allclose([s.score for s in row], sorted(expected, reverse=True), rtol=1e-6)
    (raw,) = classification([Labels(logits, ("a", "b", "c"))], True, 3).results
    assert [s.score for s in raw] == [3.0, 1.0, 0.0]


@pytest.mark.parametrize(
    ("query", "documents", "top_n", "param"),
    [
        ("", ["a"], None, "query"),
        ("q", [], None, "documents"),
        ("q", ["a", None], None, "documents"),
        ("q", "a", None, "documents"),
        ("q", ["a"], 0, "top_n"),
        ("q", ["a"] * 3, None, "documents"),
    ],
)
def test_bad_rerank_input(query: object, documents: object, top_n: int | None, param: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        check_rerank_input(query, documents, 2, 100, top_n)
    assert caught.value.param == param


def test_sparse_dot_matches_dense_dot() -> None:
    a = SparseVector(np.array([1, 5, 9]), np.array([0.5, 2.0, 1.0], np.float32))
    b = SparseVector(np.array([9, 2, 5]), np.array([3.0, 1.0, 0.25], np.float32))
    assert sparse_dot(a, b) == pytest.approx(0.5 * 0 + 2.0 * 0.25 + 1.0 * 3.0)


def test_embedding_scores_of_nan_or_infinity_are_an_error_naming_the_document() -> None:
    query = Embedding(dense=np.array([1.0, 0.0], np.float32))
    documents = [Embedding(dense=np.array([0.0, 1.0], np.float32)), Embedding(dense=np.array([np.nan, 1], np.float32))]
    with pytest.raises(BatchFailed, match="score document 1 as NaN or infinity"):
        embedding_scores(COSINE, query, documents, mean_maxsim=False)
    assert embedding_scores(COSINE, query, documents[:1], mean_maxsim=False) == [0.0]
