"""LoRA adapters in PEFT's format for a tiny embedder, saved by PEFT itself."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from tests.builders.text import tiny_bert


@contextlib.contextmanager
def peft_quietly() -> Iterator[None]:
    """PEFT asks transformers `is_gradient_checkpointing`, which transformers has renamed."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*is_gradient_checkpointing.*", FutureWarning)
        yield


def save_adapter(base: Path, target: Path, seed: int, **settings: Any) -> Path:
    """A LoRA adapter of the transformers model in `base` (`LoraConfig(**settings)`), its B factors
    random: PEFT starts them at zero, an adapter that changes nothing."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel

    torch.manual_seed(seed)
    with peft_quietly():
        model = get_peft_model(AutoModel.from_pretrained(str(base)), LoraConfig(**settings))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.5)
    model.save_pretrained(str(target))
    return target


def tiny_bert_with_adapter(root: Path) -> Path:
    """A tiny sentence-transformers BERT with one adapter published beside it, in `adapters/legal`."""
    tiny_bert(root)
    save_adapter(root, root / "adapters" / "legal", 1, r=4, lora_alpha=8, target_modules=["query", "value"])
    return root


def merged(directory: Path, adapter: Path | None) -> Any:
    """sentence-transformers on the model in `directory`, with PEFT's merge of `adapter` into it."""
    from peft import PeftModel
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(directory), device="cpu")
    if adapter is not None:
        module = model[0]
        base = module.auto_model
        assert isinstance(base, torch.nn.Module)
        with peft_quietly():
            module.auto_model = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    return model
