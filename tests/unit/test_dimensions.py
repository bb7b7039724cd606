"""A Matryoshka cut (`dimensions`) in the library's `embed`: refused before any work where it cannot
apply, applied to the model's vectors as the first components re-normalised."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from model_registry import Embedding, InvalidInput, Registry
from model_registry.adapters.fake import fake_vector
from model_registry.runtime.worker import BatchStats

FAKE = {"name": "fake", "source": "fake", "kind": "fake", "options": {"dimensions": 16}}


async def _registry(counted: list[BatchStats]) -> Any:
    return Registry.from_config({"models": [FAKE]}, on_batch=counted.append)


async def test_a_cut_is_the_first_components_renormalised() -> None:
    counted: list[BatchStats] = []
    async with await _registry(counted) as registry:
        results = await registry.embed("fake", ["a", "b"], dimensions=5)
    for text, item in zip(("a", "b"), results.items, strict=True):
        assert isinstance(item, Embedding)
        assert item.dense is not None
        whole = fake_vector(text, 16)
        np.testing.assert_allclose(item.dense, whole[:5] / np.linalg.norm(whole[:5]), atol=1e-6)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dimensions": 17}, "dimensions must be between 1 and 16 for the model 'fake', got 17"),
        ({"dimensions": 0}, "dimensions must be between 1 and 16"),
        ({"dimensions": 99, "dimensions_param": "output_dimension"}, "output_dimension must be between 1 and 16"),
    ],
)
async def test_a_cut_past_the_model_is_refused_before_any_work(options: dict[str, Any], message: str) -> None:
    counted: list[BatchStats] = []
    async with await _registry(counted) as registry:
        await registry.embed("fake", ["warm"])  # loaded, its warm-up done
        counted.clear()
        with pytest.raises(InvalidInput, match=message) as refused:
            await registry.embed("fake", ["a", "b"], **options)
    assert refused.value.param == options.get("dimensions_param", "dimensions")
    assert counted == [], "the model ran before the cut was refused"
