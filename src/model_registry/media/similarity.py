"""Relevance scores between embeddings, shared by every rerank path that has no cross-encoder.

The dense scores are sentence-transformers' similarity functions (`cos_sim`, `dot_score`,
`euclidean_sim`, `manhattan_sim`): the distances are negated, so that higher is always closer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from model_registry.types import Similarity, SparseVector

Array = npt.NDArray[np.float32]


def normalized(vectors: Array) -> Array:
    """Each row scaled to unit length (a zero row stays zero), in float32."""
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    unit: Array = (vectors / np.maximum(norms, 1e-12)).astype(np.float32)
    return unit


def matryoshka(vector: Array, dimensions: int) -> Array:
    """A Matryoshka cut: the first `dimensions` components, re-normalised."""
    return normalized(vector[..., :dimensions])


def cosine(query: Array, documents: Array) -> Array:
    """Cosine similarity of one query vector (d,) with each document row (n, d)."""
    q = query / max(float(np.linalg.norm(query)), 1e-12)
    norms = np.maximum(np.linalg.norm(documents, axis=1), 1e-12)
    scores: Array = (documents @ q) / norms
    return scores.astype(np.float32)


def dot(query: Array, documents: Array) -> Array:
    """Dot product of one query vector (d,) with each document row (n, d)."""
    scores: Array = documents @ query
    return scores.astype(np.float32)


def euclidean(query: Array, documents: Array) -> Array:
    """Negated Euclidean distance of one query vector (d,) to each document row (n, d)."""
    scores: Array = -np.linalg.norm(documents - query, axis=1)
    return scores.astype(np.float32)


def manhattan(query: Array, documents: Array) -> Array:
    """Negated Manhattan (L1) distance of one query vector (d,) to each document row (n, d)."""
    scores: Array = -np.abs(documents - query).sum(axis=1)
    return scores.astype(np.float32)


#: Each dense similarity's function: (query (d,), documents (n, d)) -> scores (n,).
DENSE: Mapping[Similarity, Callable[[Array, Array], Array]] = MappingProxyType(
    {Similarity.COSINE: cosine, Similarity.DOT: dot, Similarity.EUCLIDEAN: euclidean, Similarity.MANHATTAN: manhattan}
)


def maxsim(query: Array, document: Array) -> float:
    """Late-interaction score: for each query token, the best dot product over document tokens, summed.

    `query` is (q, d) and `document` is (t, d); padding must already be removed.
    """
    if query.size == 0 or document.size == 0:
        return 0.0
    return float((query @ document.T).max(axis=1).sum())


def sparse_dot(query: SparseVector, document: SparseVector) -> float:
    """Dot product of two sparse vectors given as sorted or unsorted (indices, values)."""
    common, q_at, d_at = np.intersect1d(query.indices, document.indices, assume_unique=True, return_indices=True)
    if common.size == 0:
        return 0.0
    return float(np.dot(np.asarray(query.values)[q_at], np.asarray(document.values)[d_at]))
