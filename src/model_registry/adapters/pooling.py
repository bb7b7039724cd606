"""Pooling token states into one vector, as sentence-transformers defines each mode.

`mask` marks the tokens that count (padding and, when the model excludes it, the prompt are 0);
`attention` is the model's attention mask (padding only), used to find the last real token.
"""

from __future__ import annotations

import torch


def exclude_prompt(mask: torch.Tensor, prompt_tokens: torch.Tensor) -> torch.Tensor:
    """Zero the first `prompt_tokens[i]` real tokens of row i (left padding included)."""
    if not bool((prompt_tokens > 0).any()):
        return mask
    first_real = mask.to(torch.int32).argmax(dim=1)
    positions = torch.arange(mask.shape[1], device=mask.device).unsqueeze(0)
    cut = (first_real + prompt_tokens.to(first_real.dtype)).unsqueeze(1)
    return mask.masked_fill(positions < cut, 0)


def pool(states: torch.Tensor, mask: torch.Tensor, attention: torch.Tensor, mode: str) -> torch.Tensor:
    """(batch, tokens, hidden) -> (batch, hidden), accumulating in float32.

    The weighted sums over the tokens are batched matrix products of (batch, 1, tokens) weights
    with the states: one pass over the states, where an elementwise product and a sum write and
    read a (batch, tokens, hidden) temporary: about 3x faster on 2 cores for a GPU-sized batch of
    16,384 tokens.
    """
    states = states.float()
    if mode == "cls":
        first = mask.to(torch.int32).argmax(dim=1)
        return states[torch.arange(states.shape[0], device=states.device), first]
    if mode == "lasttoken":
        length = attention.shape[1]
        values, from_end = attention.flip(1).max(dim=1)
        from_end = torch.where(values == 0, length - 1, from_end)
        last = length - 1 - from_end
        return states[torch.arange(states.shape[0], device=states.device), last] * values.unsqueeze(-1).to(states.dtype)
    if mode == "max":
        return states.masked_fill(mask.unsqueeze(-1) == 0, float("-inf")).max(dim=1).values
    weights = mask.to(states.dtype)
    if mode in ("mean", "mean_sqrt_len_tokens"):
        count = weights.sum(dim=1, keepdim=True).clamp(min=1e-9)
        return _weighted_sum(states, weights) / (count if mode == "mean" else count.sqrt())
    if mode == "weightedmean":
        position = torch.arange(1, states.shape[1] + 1, device=states.device, dtype=states.dtype).view(1, -1)
        pad_lengths = attention.to(torch.int32).argmax(dim=1).to(states.dtype)
        weighted = weights * (position - pad_lengths.view(-1, 1))
        return _weighted_sum(states, weighted) / weighted.sum(dim=1, keepdim=True).clamp(min=1e-9)
    raise ValueError(f"unknown pooling mode '{mode}'")


def _weighted_sum(states: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum over tokens of weights[b, t] * states[b, t, :]: (batch, tokens, hidden) -> (batch, hidden)."""
    return torch.bmm(weights.unsqueeze(1), states).squeeze(1)
