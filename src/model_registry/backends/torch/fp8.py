"""`quantize: fp8` on the torch engine: a transformer's linear layers in 8-bit floats.

The weights of those layers are stored as float8_e4m3fn with a float32 scale per output row, and
each forward pass scales its activations to float8 too, with a scale per token, so that a text's
vector never depends on the other texts in its batch; the products run on the GPU's fp8 tensor
cores through torchao's float8 kernels, which needs compute capability 8.9 or higher (`GPUS`).
Everything else stays in bfloat16 (torchao's per-row scales take bfloat16 weights; its float16
path scales a whole batch at once): the embeddings (a lookup, no product), the heads (a pooler, a
classifier, a decoder reranker's score rows, an LM head's rows: few weights, and they set the
output's scale), and any layer whose sizes are not multiples of 16, which fp8 products need.

The configuration's rules (`check_options`, `check_kind`) import nothing; torch and torchao are
imported on the engine's load (`ready`, `convert`), so that `import model_registry` never needs them.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from model_registry.errors import ModelUnavailable

if TYPE_CHECKING:
    import torch

MIN_CAPABILITY = (8, 9)
GPUS = "Ada (L4, L40S, RTX 40 series), Hopper (H100, H200) or Blackwell (B200, RTX 50 series)"
INSTALL = "pip install 'infinity-server[fp8]'"
#: Kinds fp8 serves: their outputs are dense vectors or scores, which the quality gates measure
#: (mean cosine to the same model in float16, Spearman on STS-b).
KINDS = frozenset({"dense", "reranker", "classifier", "multivector"})
#: Kinds refused, and why.
REFUSED = {
    "sparse": "a sparse model's weights are cut at zero, so 8-bit rounding decides which terms exist at all, "
    "which the dense-vector quality gates do not measure",
    "multi_output": "BGE-M3's lexical weights are cut at zero, so 8-bit rounding decides which terms exist at all, "
    "which the dense-vector quality gates do not measure",
    "image_text": "its towers run in their adapter, not on the torch engine that fp8 converts",
    "audio_text": "its towers run in their adapter, not on the torch engine that fp8 converts",
    "page_text": "its towers run in their adapter, not on the torch engine that fp8 converts",
    "fake": "it has no weights",
}
#: The configured `dtype`s fp8 takes, for what it leaves alone: bfloat16.
DTYPES = ("auto", "bfloat16")
#: Module names (a path's parts) that are never converted: embeddings and heads.
_KEPT = ("embed", "pooler", "head", "classifier", "score")


def check_kind(name: str, kind: str) -> None:
    """ValueError where fp8 would be wrong for a `kind` model (or never applied to it)."""
    if kind in KINDS or kind == "auto":
        return
    why = REFUSED.get(kind, "fp8 is checked on dense, reranker, classifier and multivector models only")
    raise ValueError(
        f"model '{name}': quantize: fp8 does not run a {kind} model ({why}); "
        f"it serves {', '.join(sorted(KINDS))}; set quantize: none"
    )


def check_options(name: str, backend: str, dtype: str, device: str, kind: str) -> None:
    """ValueError for what the configuration alone rules out: another engine, a precision for the
    rest other than 16 bits, a device that is not a CUDA GPU, a kind fp8 does not serve."""
    if backend not in ("torch", "auto"):
        raise ValueError(
            f"model '{name}': quantize: fp8 runs on backend: torch (or auto), not {backend}; "
            f"{backend}'s own 8-bit path is quantize: int8"
        )
    if dtype not in DTYPES:
        raise ValueError(
            f"model '{name}': quantize: fp8 keeps the layers it does not convert in bfloat16 (its float8 "
            f"scales per token take bfloat16 weights); set dtype: auto or bfloat16, not {dtype}"
        )
    if device != "auto" and not device.startswith("cuda"):
        raise ValueError(
            f"model '{name}': quantize: fp8 needs an NVIDIA GPU of compute capability 8.9 or higher ({GPUS}), "
            f"not device: {device}; set quantize: none, or quantize: int8 with backend: onnx or ctranslate2"
        )
    check_kind(name, kind)


def ready(dtype: str, device: str) -> torch.dtype:
    """The dtype of the layers fp8 leaves alone (bfloat16), once `device` is known to run fp8 and
    torchao is installed; else ModelUnavailable naming what is missing (before any weight is read)."""
    import torch

    if not device.startswith("cuda"):
        raise ModelUnavailable(
            f"quantize: fp8 needs an NVIDIA GPU of compute capability 8.9 or higher ({GPUS}), and this model "
            f"loads on {device}; set quantize: none, or quantize: int8 with backend: onnx or ctranslate2"
        )
    capability = torch.cuda.get_device_capability(device)
    if tuple(capability) < MIN_CAPABILITY:
        gpu = torch.cuda.get_device_name(device)
        raise ModelUnavailable(
            f"quantize: fp8 needs compute capability 8.9 or higher ({GPUS}); {gpu} on {device} has "
            f"{capability[0]}.{capability[1]}; set quantize: none (dtype: float16 runs on it)"
        )
    try:
        import torchao.quantization  # noqa: F401
    except ImportError:
        raise ModelUnavailable(
            f"quantize: fp8 runs on torchao's float8 kernels, and torchao is not installed: {INSTALL}"
        ) from None
    if dtype not in DTYPES:
        raise ModelUnavailable(f"quantize: fp8 runs the other layers in bfloat16, not {dtype}")
    return torch.bfloat16


def targets(model: Any) -> list[str]:
    """The names (in `model`) of the linear layers fp8 converts: those of the base transformer,
    not its embeddings, pooler or heads, each with both sizes a multiple of 16."""
    import torch

    base = getattr(model, "base_model", model)
    prefix = "" if base is model else f"{model.base_model_prefix}."
    chosen = []
    for name, module in base.named_modules():
        if type(module) is not torch.nn.Linear:
            continue
        if any(kept in part for part in name.split(".") for kept in _KEPT):
            continue
        rows, columns = module.weight.shape
        if rows % 16 == 0 and columns % 16 == 0:
            chosen.append(prefix + name)
    return chosen


def convert(model: Any) -> str:
    """Convert `model`'s `targets` in place (already on its device, in bfloat16); the precision as
    `/models` shows it. ModelUnavailable where no layer qualifies: fp8 would change nothing."""
    import torch
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_

    names = set(targets(model))
    if not names:
        raise ModelUnavailable(
            "quantize: fp8 found no linear layer to convert: fp8 products need both sizes of a layer to be "
            "multiples of 16, and this model's transformer has none such; set quantize: none"
        )
    config = Float8DynamicActivationFloat8WeightConfig(
        granularity=PerRow(),  # a scale per token and per output row
        set_inductor_config=False,  # nothing here is compiled; leave the process-wide settings alone
    )
    device = next(model.parameters()).device
    # torchao asks the current CUDA device for its capability: make it the model's.
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        quantize_(model, config, filter_fn=lambda _, name: name in names)
    return f"float8_e4m3fn ({len(names)} linear layers, per-row scales), bfloat16 elsewhere"
