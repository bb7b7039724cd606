"""Loading transformers checkpoints: refused with weights missing, and one load at a time."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from model_registry.backends.weights import from_pretrained_checked
from model_registry.errors import ModelUnavailable


class Recording:
    """A stand-in auto class: records how many of its loads overlap, and what the report says."""

    inside = 0
    most = 0
    missing: tuple[str, ...] = ()
    lock = threading.Lock()

    @classmethod
    def from_pretrained(cls, directory: str, **kwargs: Any) -> tuple[object, dict[str, Any]]:
        with cls.lock:
            cls.inside += 1
            cls.most = max(cls.most, cls.inside)
        # transformers sets the process-wide default dtype while it builds the model
        before = torch.get_default_dtype()
        torch.set_default_dtype(kwargs.get("dtype", torch.float32))
        time.sleep(0.05)
        built = torch.get_default_dtype()
        torch.set_default_dtype(before)
        with cls.lock:
            cls.inside -= 1
        return built, {"missing_keys": set(cls.missing), "mismatched_keys": set()}


def test_loads_in_other_precisions_never_overlap() -> None:
    """A float16 load and a float32 one at once would each build in the other's precision."""
    built: list[tuple[torch.dtype, object]] = []

    def load(dtype: torch.dtype) -> None:
        built.append((dtype, from_pretrained_checked(Recording, Path("x"), "feature-extraction", dtype=dtype)))

    threads = [threading.Thread(target=load, args=(d,)) for d in (torch.float16, torch.float32) * 3]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert Recording.most == 1
    assert all(asked == got for asked, got in built)


def test_missing_weights_are_named_and_an_unused_pooler_is_not() -> None:
    Recording.missing = ("classifier.weight", "classifier.bias")
    with pytest.raises(ModelUnavailable, match=r"2 weight\(s\) missing \(classifier.bias, classifier.weight\)"):
        from_pretrained_checked(Recording, Path("x"), "sequence-classification")
    Recording.missing = ("pooler.dense.weight", "pooler.dense.bias")
    from_pretrained_checked(Recording, Path("x"), "feature-extraction")
    with pytest.raises(ModelUnavailable, match=r"pooler\.dense"):
        from_pretrained_checked(Recording, Path("x"), "sequence-classification")
    Recording.missing = ()
