"""The torch backend: device and dtype choice, CPU threads, sizes, releasing memory.

torch is imported here and in adapters that run on it, never by `import model_registry`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

import torch

from model_registry.errors import ModelUnavailable

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_threads_lock = threading.Lock()
_threads_set = False


def resolve_device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ModelUnavailable(f"device '{requested}' was asked for, but CUDA is not available on this machine")
    return requested


def resolve_dtype(requested: str, device: str) -> torch.dtype:
    """'auto' is float16 on CUDA and float32 elsewhere (half precision is slow on CPUs)."""
    if requested == "auto":
        return torch.float16 if device.startswith("cuda") else torch.float32
    if requested not in _DTYPES:
        raise ModelUnavailable(f"dtype '{requested}' is not supported by the torch backend; use {sorted(_DTYPES)}")
    return _DTYPES[requested]


def configure_threads(threads: int | None) -> None:
    """Set torch's intra-op threads once per process: every core, one inter-op thread.

    Models share the cores; a second model asking for a different count does not change it.
    """
    global _threads_set
    with _threads_lock:
        if _threads_set:
            return
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        count = threads or cores
        torch.set_num_threads(max(1, int(count or 1)))
        # Already set, or parallel work already started: keep torch's choice.
        with contextlib.suppress(RuntimeError):
            torch.set_num_interop_threads(1)
        _threads_set = True


def module_bytes(module: torch.nn.Module) -> int:
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def activation_estimate(config: Any, max_batch_tokens: int, max_length: int | None, dtype: torch.dtype) -> int:
    """An honest upper estimate of a transformer's working memory for one full batch.

    Hidden states (a few live copies, the FFN expansion) grow with the token count; attention
    scores grow with tokens x sequence length x heads.
    """
    hidden = int(getattr(config, "hidden_size", 768) or 768)
    heads = int(getattr(config, "num_attention_heads", 12) or 12)
    intermediate = int(getattr(config, "intermediate_size", 4 * hidden) or 4 * hidden)
    length = max_length or 512
    width = torch.finfo(dtype).bits // 8
    per_token = (6 * hidden + 2 * intermediate) * width
    attention = heads * min(length, max_batch_tokens) * width * 2
    return max_batch_tokens * (per_token + attention)
