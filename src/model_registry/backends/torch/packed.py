"""Padding-free batches for the torch engine: a batch's sequences concatenated into one row.

A padded batch of B rows of L tokens becomes one row of the T real tokens, with the offsets of
each sequence (`cu_seqlens`, B + 1 of them) and positions that restart at every sequence. The
model's own layers run on that row; its attention goes through `attention`, registered with
transformers' `AttentionInterface` under `ATTENTION`, which keeps every token inside its own
sequence: `torch.nn.attention.varlen.varlen_attn` on CUDA (nothing computed for padding), or, where
that kernel is missing, SDPA over the whole row with a block-diagonal mask (the same attention,
used to test the packing on a CPU). The batch is packed on the host, so the device never holds
its padded layout, and its outputs stay packed: the adapters pool each sequence's segment
(`adapters.segments`), and a decoder's head reads each sequence's last token.

Outside `forward` a model switched to `ATTENTION` runs exactly as it does on SDPA.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from model_registry.backends.base import Packed

ATTENTION = "padding_free"
Kernel = Literal["varlen", "sdpa"]

#: model_type -> where its positions start (None: the model's pad token id + 1, as RoBERTa's
#: absolute positions do).
_POSITION_START: dict[str, int | None] = {
    "bert": 0,
    "modernbert": 0,
    "qwen2": 0,
    "qwen3": 0,
    "gemma3_text": 0,
    "jina_embeddings_v3": 0,  # rotary positions from 0 (its port's), with or without task adapters
    "xlm-roberta": None,
    "roberta": None,
}


@dataclass(frozen=True)
class Packing(Packed):
    """One packed batch (`Packed`'s layout, T tokens) and what its attention needs: the longest
    sequence, the kernel and, where some packed tokens are not attended to (ColBERT's query
    expansion), `keys` (T,) bool marking those that are, with their own offsets `cu_keys`."""

    keep: torch.Tensor
    cu_seqlens: torch.Tensor
    segments: torch.Tensor
    max_length: int
    kernel: Kernel
    keys: torch.Tensor | None = None
    cu_keys: torch.Tensor | None = None
    max_keys: int = 0
    masks: dict[tuple[bool, int | None], torch.Tensor] = field(default_factory=dict)


_active: contextvars.ContextVar[Packing | None] = contextvars.ContextVar("packing", default=None)


def position_start(config: Any) -> int | None:
    """Where a packable family's positions start; None for a family that is not packed."""
    model_type = getattr(config, "model_type", None)
    if model_type not in _POSITION_START:
        return None
    start = _POSITION_START[model_type]
    return int(config.pad_token_id) + 1 if start is None else start


def supported_families() -> list[str]:
    return sorted(_POSITION_START)


def varlen_available() -> bool:
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def pack(
    mask: torch.Tensor, kernel: Kernel, device: str | torch.device | None = None, attended: torch.Tensor | None = None
) -> Packing:
    """The packing of a padded batch whose tokens `mask` (B, L, on the host) marks, left or right
    padded, with its offsets on `device` (None: the mask's). `attended` (B, L), where given, marks
    the packed tokens that the attention sees (the others still get outputs)."""
    keep = mask.bool()
    lengths = keep.sum(dim=1)
    cu_seqlens, longest = _offsets(lengths)
    segments = torch.arange(keep.shape[0]).repeat_interleave(lengths)
    to = mask.device if device is None else device
    if attended is None:
        return Packing(keep, cu_seqlens.to(to), segments.to(to), longest, kernel)
    seen = attended.bool() & keep
    cu_keys, most = _offsets(seen.sum(dim=1))
    keys = seen[keep].to(to)
    return Packing(keep, cu_seqlens.to(to), segments.to(to), longest, kernel, keys, cu_keys.to(to), most)


def _offsets(lengths: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(B + 1,) int32 offsets of sequences of `lengths`, and the longest."""
    offsets = torch.zeros(lengths.shape[0] + 1, dtype=torch.int32)
    offsets[1:] = lengths.cumsum(0)
    return offsets, int(lengths.max().item()) if len(lengths) else 0


def positions(packing: Packing, start: int) -> torch.Tensor:
    """(1, T) position ids that restart at `start` for every sequence."""
    total = packing.segments.shape[0]
    first = packing.cu_seqlens[:-1].long()[packing.segments]
    return (torch.arange(total, device=first.device) - first + start).unsqueeze(0)


def flatten(values: torch.Tensor, packing: Packing) -> torch.Tensor:
    """(B, L) padded ids -> (1, T) of the packed tokens, on the device `values` is on (the host)."""
    return values[packing.keep].unsqueeze(0)


def forward(module: Any, packing: Packing, ids: torch.Tensor, extra: dict[str, torch.Tensor], start: int) -> Any:
    """`module`'s first output for the packed batch, (T, X), from its flattened (1, T) `ids` and
    `extra` inputs on the device. `module` must run on `ATTENTION` (`switch`)."""
    with _activated(packing):
        output = module(input_ids=ids, position_ids=positions(packing, start), **extra)
    return output[0][0]


def last(states: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """(T, X) -> (B, X): each sequence's last token (zeros for an empty one)."""
    ends = cu_seqlens[1:].long()
    picked = states[ends - 1]
    return picked * (ends > cu_seqlens[:-1]).unsqueeze(-1).to(picked.dtype)


@contextmanager
def _activated(packing: Packing) -> Iterator[None]:
    token = _active.set(packing)
    try:
        yield
    finally:
        _active.reset(token)


def switch(model: Any) -> None:
    """Run `model`'s attention through `attention` (registered once per process)."""
    _register()
    model.set_attn_implementation(ATTENTION)


@functools.cache
def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION, attention)
    AttentionMaskInterface.register(ATTENTION, attention_mask)


def attention_mask(**kwargs: Any) -> Any:
    """No mask for a packed batch (`attention` keeps sequences apart); SDPA's mask otherwise."""
    if _active.get() is not None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(**kwargs)


def attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: (1, heads, T, dim) in, (1, T, heads, dim) out.

    `sliding_window` follows transformers' flash-attention convention: a token sees the tokens
    less than `sliding_window` away (and only earlier ones in a causal model)."""
    packing = _active.get()
    if packing is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    if softcap is not None:
        raise RuntimeError("This is a bug: a model with attention soft-capping was packed")
    causal = bool(getattr(module, "is_causal", False))
    if causal and packing.keys is not None:
        raise RuntimeError("This is a bug: a causal model was packed with tokens it does not attend to")
    gqa = query.shape[1] != key.shape[1]
    if packing.kernel == "varlen":
        return _varlen(packing, query, key, value, scaling, causal, sliding_window, gqa), None
    mask = _block_mask(packing, causal, sliding_window)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling, enable_gqa=gqa
    )
    return out.transpose(1, 2).contiguous(), None


def _varlen(
    packing: Packing,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float | None,
    causal: bool,
    window: int | None,
    gqa: bool,
) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))
    cu_k, longest_k = packing.cu_seqlens, packing.max_length
    if packing.keys is not None:
        k, v, cu_k, longest_k = _attended(packing, k, v, window)
        window = None
    left = -1 if window is None else window - 1
    out = varlen_attn(
        q,
        k,
        v,
        packing.cu_seqlens,
        cu_k,
        packing.max_length,
        longest_k,
        scale=scaling,
        window_size=(left, 0 if causal else left),
        enable_gqa=gqa,
    )
    assert isinstance(out, torch.Tensor)
    return out.unsqueeze(0)


def _attended(
    packing: Packing, key: torch.Tensor, value: torch.Tensor, window: int | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The keys and values the attention sees (T', heads, dim), their offsets and longest run.

    The kernel lines a shorter key sequence up with the end of its queries, so a sliding window
    cannot be kept: it is refused where it would bind (ColBERT's queries are shorter than any)."""
    if window is not None and window <= packing.max_length:
        raise RuntimeError(
            f"a sliding window of {window} tokens cannot be kept for sequences of up to "
            f"{packing.max_length} tokens that the attention partly ignores (ColBERT query expansion)"
        )
    assert packing.keys is not None, "This is a bug: no attended tokens"
    assert packing.cu_keys is not None, "This is a bug: attended tokens without their offsets"
    return key[packing.keys], value[packing.keys], packing.cu_keys, packing.max_keys


def _block_mask(packing: Packing, causal: bool, window: int | None) -> torch.Tensor:
    """(1, 1, T, T): a token sees its own sequence's tokens (earlier ones if causal, within the
    window if any); built once per batch for each kind of layer."""
    found = packing.masks.get((causal, window))
    if found is not None:
        return found
    segments = packing.segments
    mask = segments.unsqueeze(1) == segments.unsqueeze(0)
    index = torch.arange(segments.shape[0], device=segments.device)
    distance = index.unsqueeze(1) - index.unsqueeze(0)
    if causal:
        mask &= distance >= 0
    if window is not None:
        mask &= distance.abs() < window
    if packing.keys is not None:
        mask &= packing.keys.unsqueeze(0)
    packing.masks[(causal, window)] = mask = mask[None, None]
    return mask


def choose(config: Any, device: str, dtype: torch.dtype, task: str, decoder: bool) -> tuple[Kernel | None, str]:
    """The kernel a model's batches run padding-free on, or None (padded), and why."""
    model_type = getattr(config, "model_type", None)
    if position_start(config) is None:
        return None, f"model type '{model_type}' is not packed (packed: {', '.join(supported_families())})"
    if task == "sequence-classification" and not decoder:
        return None, "the classifier head pools inside the model, over padded rows"
    if not device.startswith("cuda"):
        return None, "no variable-length attention kernel on this device; padded SDPA"
    if not varlen_available():
        return None, "this torch has no torch.nn.attention.varlen"
    if dtype not in (torch.float16, torch.bfloat16):
        return None, f"variable-length attention runs in float16 or bfloat16, not {str(dtype).removeprefix('torch.')}"
    return "varlen", "variable-length attention on concatenated sequences (torch varlen_attn)"
