"""Loading a transformers checkpoint with every weight its task needs, or not at all.

transformers initialises at random whatever a checkpoint lacks for the class it is loaded as (a
classification head on a base model, the LoRA layers of a model whose code lives elsewhere) and
only reports it. A model served that way answers with numbers that mean nothing, so a load that
leaves any weight missing or reshaped is refused here, naming the weights.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from model_registry.errors import ModelUnavailable

#: Weights a task may leave out because it never reads them: BERT's pooler under mean or CLS
#: pooling of the hidden states (masked-LM checkpoints do not carry it).
_UNUSED: dict[str, tuple[str, ...]] = {"feature-extraction": ("pooler.",)}
_SHOWN = 5
_LOADING = threading.Lock()


def from_pretrained_checked(
    auto_class: Any, directory: Path, task: str, *, unread: tuple[str, ...] = (), **kwargs: Any
) -> Any:
    """`auto_class.from_pretrained(directory, **kwargs)`, refused when weights are missing, but for
    those under the prefixes `unread`, which the caller never reads.

    One at a time in the process: transformers builds a model of another precision by setting
    torch's process-wide default dtype, so two loads at once (a float16 model and a float32 one)
    would each build part of their model in the other's precision."""
    with _LOADING:
        model, info = auto_class.from_pretrained(str(directory), output_loading_info=True, **kwargs)
    missing = sorted(k for k in info.get("missing_keys", ()) if not _unused(task, k) and not k.startswith(unread))
    mismatched = sorted(str(k[0]) if isinstance(k, tuple) else str(k) for k in info.get("mismatched_keys", ()))
    if missing or mismatched:
        raise ModelUnavailable(_message(auto_class, task, missing, mismatched))
    return model


def _unused(task: str, key: str) -> bool:
    return any(key.startswith(prefix) or f".{prefix}" in key for prefix in _UNUSED.get(task, ()))


def _message(auto_class: Any, task: str, missing: list[str], mismatched: list[str]) -> str:
    name = getattr(auto_class, "__name__", str(auto_class))
    parts = []
    if missing:
        parts.append(f"{len(missing)} weight(s) missing ({_some(missing)})")
    if mismatched:
        parts.append(f"{len(mismatched)} weight(s) of another shape ({_some(mismatched)})")
    return (
        f"its files lack what {name} needs for {task}: {' and '.join(parts)}, which would be initialised at "
        "random. The model may need its own code (`trust_remote_code: true`, with that code in the model "
        "directory or the local hub cache) or another `kind:` (a causal LM is not a classifier or an embedder "
        "unless its files say so)"
    )


def _some(keys: list[str]) -> str:
    shown = ", ".join(keys[:_SHOWN])
    return shown + (f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else "")


_PICKLED = (".bin", ".pt", ".pth")


def weight_bytes(directory: Path) -> int:
    """Bytes of torch weight files under `directory`: a fair first estimate of a model's weights.

    Where a folder has both safetensors and pickled weights they are copies, so only the
    safetensors count; other backends' files (ONNX, CTranslate2) are not what torch loads.
    """
    total = 0
    for folder in (directory, *(p for p in directory.rglob("*") if p.is_dir())):
        files = [p for p in folder.iterdir() if p.is_file()]
        chosen = [p for p in files if p.suffix == ".safetensors"] or [p for p in files if p.suffix in _PICKLED]
        total += sum(p.stat().st_size for p in chosen)
    return total


def activation_bytes(config: Any, max_batch_tokens: int, max_length: int | None, width: int) -> int:
    """An honest upper estimate of a transformer's working memory for one full batch, its values
    `width` bytes each.

    Hidden states (a few live copies, the FFN expansion) grow with the token count; attention
    scores grow with tokens x sequence length x heads.
    """
    hidden = int(getattr(config, "hidden_size", 768) or 768)
    heads = int(getattr(config, "num_attention_heads", 12) or 12)
    intermediate = int(getattr(config, "intermediate_size", 4 * hidden) or 4 * hidden)
    length = max_length or 512
    per_token = (6 * hidden + 2 * intermediate) * width
    attention = heads * min(length, max_batch_tokens) * width * 2
    return max_batch_tokens * (per_token + attention)
