"""Ranking helpers: method choice, ordering, top_n, softmax, input checks."""

from __future__ import annotations

import numpy as np
import pytest

from model_registry.errors import BatchFailed, InvalidInput, UnsupportedOperation
from model_registry.media.similarity import DENSE, sparse_dot
from model_registry.tasks.classify import classification
from model_registry.tasks.rerank import COSINE, check_rerank_input, embedding_scores, ranking, rerank_method
from model_registry.types import Capability, Embedding, Labels, Similarity, SparseVector


def test_method_follows_capabilities() -> None:
    assert rerank_method(frozenset({Capability.RERANK}), "m") == "cross-encoder"
    both = frozenset({Capability.EMBED_TEXT, Capability.SPARSE, Capability.MULTIVECTOR})
    assert rerank_method(both, "m") == "maxsim"
    assert rerank_method(frozenset({Capability.EMBED_TEXT}), "m") == "cosine"
    assert rerank_method(frozenset({Capability.SPARSE}), "m") == "sparse-dot"
    for similarity in Similarity:  # a dense model's method is its similarity function
        assert rerank_method(frozenset({Capability.EMBED_TEXT}), "m", similarity) == similarity.value
    assert rerank_method(both, "m", Similarity.DOT) == "maxsim"  # BGE-M3 keeps its own scores
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


@pytest.mark.parametrize("similarity", list(Similarity))
def test_dense_scores_are_sentence_transformers_similarity_functions(similarity: Similarity) -> None:
    """Each function against sentence-transformers' own, on vectors of unequal norms (where a dot
    product is not a cosine), as the ranking calls it: one query against the documents."""
    from sentence_transformers.util import SimilarityFunction

    rng = np.random.default_rng(0)
    query = (rng.normal(size=24) * 3).astype(np.float32)
    documents = (rng.normal(size=(7, 24)) * rng.uniform(0.2, 5.0, size=(7, 1))).astype(np.float32)
    expected = SimilarityFunction.to_similarity_fn(similarity.value)(query, documents).numpy()[0]
    np.testing.assert_allclose(DENSE[similarity](query, documents), expected, rtol=1e-5, atol=1e-5)
    query_result = Embedding(dense=query)
    scores = embedding_scores(
        similarity.value, query_result, [Embedding(dense=d) for d in documents], mean_maxsim=False
    )
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-5)
