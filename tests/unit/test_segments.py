"""Pooling a padding-free batch per segment against pooling its padded layout: every mode, left
and right padding, the prompt left out, SPLADE's max and sum in half precision, ragged rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model_registry.adapters import segments, splade
from model_registry.adapters.pooling import exclude_prompt, pool
from model_registry.backends.torch import packed

MODES = ("cls", "lasttoken", "max", "mean", "mean_sqrt_len_tokens", "weightedmean")


def padded_batch(left: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random states (4, 7, 5) of rows of 7, 3, 1 and 5 real tokens, padding states not zero,
    their attention mask and the pooling mask with 2, 0, 0 and 1 prompt tokens left out."""
    generator = torch.Generator().manual_seed(0)
    states = torch.randn(4, 7, 5, generator=generator)
    lengths = [7, 3, 1, 5]
    attention = torch.zeros(4, 7, dtype=torch.int64)
    for row, length in enumerate(lengths):
        if left:
            attention[row, 7 - length :] = 1
        else:
            attention[row, :length] = 1
    return states, attention, exclude_prompt(attention, torch.tensor([2, 0, 0, 1]))


@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
@pytest.mark.parametrize("mode", MODES)
def test_each_pooling_mode_per_segment_equals_the_padded_pooling(mode: str, left: bool) -> None:
    states, attention, pool_mask = padded_batch(left)
    packing = packed.pack(attention, "sdpa")
    weights = segments.tokens(pool_mask, packing)
    found = segments.pool(states[packing.keep], weights, packing.segments, packing.cu_seqlens, mode)
    expected = pool(states, pool_mask, attention, mode)
    torch.testing.assert_close(found, expected, rtol=0, atol=1e-6)


def test_the_weights_of_weighted_mean_count_from_each_sequence_start() -> None:
    """Written down: a row [a, b] pools (1a + 2b) / 3 wherever its padding is."""
    states = torch.tensor([[1.0], [4.0], [10.0]])
    cu_seqlens = torch.tensor([0, 2, 3], dtype=torch.int32)
    rows = torch.tensor([0, 0, 1])
    found = segments.pool(states, torch.ones(3), rows, cu_seqlens, "weightedmean")
    assert found.flatten().tolist() == [3.0, 10.0]


@pytest.mark.parametrize("strategy", ["max", "sum"])
def test_splade_per_segment_in_half_precision_equals_the_padded_pooling(
    strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(splade, "_WIDENED", 2 * 11)  # two tokens widened at a time
    _, attention, _ = padded_batch(left=False)
    logits = torch.randn(4, 7, 11, generator=torch.Generator().manual_seed(1)).half()
    packing = packed.pack(attention, "sdpa")
    mask = segments.tokens(attention, packing)
    found = splade.splade_pool_packed(logits[packing.keep].clone(), mask, packing, strategy)
    expected = splade.splade_pool(logits.clone(), attention, strategy)
    torch.testing.assert_close(found, expected, rtol=0, atol=1e-6)


def test_ragged_rows_split_the_values_row_by_row() -> None:
    ragged = segments.Ragged(torch.arange(6.0).reshape(6, 1), (2, 0, 4))
    rows = ragged.rows()
    assert [r.flatten().tolist() for r in rows] == [[0.0, 1.0], [], [2.0, 3.0, 4.0, 5.0]]
    assert all(r.flags["C_CONTIGUOUS"] and isinstance(r, np.ndarray) for r in rows)


def test_select_takes_the_same_tokens_from_padded_and_packed_states() -> None:
    states, attention, pool_mask = padded_batch(left=True)
    packing = packed.pack(attention, "sdpa")
    chosen = pool_mask.bool()
    torch.testing.assert_close(
        segments.select(states[packing.keep], chosen, packing), segments.select(states, chosen, None)
    )
