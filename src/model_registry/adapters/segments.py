"""Heads over a padding-free batch's packed outputs (`EncoderOutput.packed`).

Each sequence's tokens are one contiguous segment of the packed (tokens, X) outputs, so pooling
reduces per segment (`index_add_` for sums, `scatter_reduce_` for maxima and firsts, over the
token -> row index `segments`), and per-token outputs (ColBERT, BGE-M3's sparse and ColBERT heads)
are each sequence's slice. Every pooling mode gives what `pooling.pool` gives on the padded
layout of the same batch; nothing here allocates (batch, longest, hidden).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from model_registry.backends.base import Packed
from model_registry.backends.torch.packed import last


@dataclass(frozen=True)
class Ragged:
    """Per-token values of a batch's rows, concatenated row after row: `values` (N, ...) and the
    number each row holds, `counts`."""

    values: torch.Tensor
    counts: tuple[int, ...]

    def rows(self) -> list[np.ndarray]:
        """Each row's values as a contiguous array, in row order."""
        array = self.values.numpy()
        return [np.ascontiguousarray(part) for part in np.split(array, np.cumsum(self.counts)[:-1])]


def tokens(padded: torch.Tensor, packed: Packed) -> torch.Tensor:
    """A (batch, tokens, ...) host tensor (a mask, token weights) at the packed tokens, on their device."""
    found: torch.Tensor = padded[packed.keep].to(packed.segments.device)
    return found


def select(states: torch.Tensor, mask: torch.Tensor, packed: Packed | None) -> torch.Tensor:
    """The states at the positions `mask` (batch, tokens, on the host) marks, row after row: from
    padded (batch, tokens, X) states, or from packed (T, X) ones (the positions must be packed)."""
    if packed is None:
        return states[mask.to(states.device)]
    return states[tokens(mask, packed)]


def reduce(values: torch.Tensor, segments: torch.Tensor, count: int, how: str, initial: float = 0.0) -> torch.Tensor:
    """(N, X) -> (count, X): the sum ('sum') or maximum ('amax') of each segment's values, folded
    into `initial` (what a row without tokens gets). The index is expanded as a view, not copied."""
    out = values.new_full((count, values.shape[1]), initial)
    if how == "sum":
        return out.index_add_(0, segments, values)
    return out.scatter_reduce_(0, segments.unsqueeze(1).expand_as(values), values, how)


def pool(
    states: torch.Tensor, weights: torch.Tensor, segments: torch.Tensor, cu_seqlens: torch.Tensor, mode: str
) -> torch.Tensor:
    """(T, hidden) packed states -> (batch, hidden), accumulating in float32, as `pooling.pool`
    pools the padded layout: `weights` (T,) are the pooling mask at the packed tokens (the prompt
    excluded where the model excludes it); `segments` and `cu_seqlens` say where each row lies."""
    states = states.float()
    count = cu_seqlens.shape[0] - 1
    if mode == "lasttoken":
        return last(states, cu_seqlens)
    if mode == "cls":
        return states[_first_weighted(weights, segments, cu_seqlens)]
    if mode == "max":
        masked = states.masked_fill(weights.unsqueeze(-1) == 0, float("-inf"))
        return reduce(masked, segments, count, "amax", float("-inf"))
    weights = weights.to(states.dtype)
    if mode == "weightedmean":  # a token's weight is its place in its sequence, from 1
        place = torch.arange(1, states.shape[0] + 1, device=states.device) - cu_seqlens[:-1].long()[segments]
        weights = weights * place.to(states.dtype)
    elif mode not in ("mean", "mean_sqrt_len_tokens"):
        raise ValueError(f"unknown pooling mode '{mode}'")
    total = reduce(weights.unsqueeze(1), segments, count, "sum").clamp(min=1e-9)
    summed = reduce(states * weights.unsqueeze(1), segments, count, "sum")
    return summed / (total.sqrt() if mode == "mean_sqrt_len_tokens" else total)


def _first_weighted(weights: torch.Tensor, segments: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Each segment's first token with a weight, else its first token (as `argmax` over a padded row)."""
    index = torch.arange(weights.shape[0], device=weights.device)
    beyond = weights.shape[0]
    candidates = torch.where(weights != 0, index, beyond)
    first = torch.full((cu_seqlens.shape[0] - 1,), beyond, dtype=index.dtype, device=index.device)
    first.scatter_reduce_(0, segments, candidates, "amin")
    return torch.where(first == beyond, cu_seqlens[:-1].long(), first)


def span_segments(
    spans: Sequence[tuple[tuple[int, int], ...]], pool_mask: torch.Tensor, packed: Packed
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Late chunking on packed states, as `dense.span_rows` on padded ones: a row without spans
    pools its own tokens by its pooling mask, a row with spans once per span over that span's
    tokens (counted from its first). The packed tokens to gather, the new segment and the weight
    of each, and the new segments' offsets."""
    lengths = packed.keep.sum(dim=1).tolist()
    weights = pool_mask[packed.keep].to(torch.float32)
    index: list[torch.Tensor] = []
    taken: list[torch.Tensor] = []
    first = 0
    for row, ranges in enumerate(spans):
        if not ranges:
            index.append(torch.arange(first, first + lengths[row]))
            taken.append(weights[first : first + lengths[row]])
        for begin, end in ranges:
            index.append(torch.arange(first + begin, first + end))
            taken.append(torch.ones(end - begin))
        first += lengths[row]
    sizes = torch.tensor([len(part) for part in index])
    cu_seqlens = torch.zeros(len(index) + 1, dtype=torch.int32)
    cu_seqlens[1:] = sizes.cumsum(0)
    segments = torch.arange(len(index)).repeat_interleave(sizes)
    device = packed.segments.device
    return torch.cat(index).to(device), segments.to(device), torch.cat(taken).to(device), cu_seqlens.to(device)
