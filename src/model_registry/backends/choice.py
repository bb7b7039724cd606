"""Which engine runs which model: the support matrix, start-up checks and the `auto` choice.

Nothing here imports an engine; the checks read only the configuration and the model's
`config.json`, so a bad combination fails when the server starts, naming the model, the
combination and what is supported.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from typing import Any

#: Families (the adapters' kinds) each engine serves. CLIP, CLAP, ColPali stay on torch.
FAMILIES: dict[str, frozenset[str]] = {
    "torch": frozenset(),  # every kind
    "onnx": frozenset({"dense", "reranker", "classifier", "sparse", "multivector", "multi_output"}),
    "ctranslate2": frozenset({"dense", "reranker", "classifier"}),
}
#: Encoder architectures (config.json `model_type`) each converting engine handles.
ARCHITECTURES: dict[str, frozenset[str]] = {
    "onnx": frozenset({"bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra", "mpnet"}),
    "ctranslate2": frozenset({"bert", "xlm-roberta", "roberta", "camembert", "distilbert"}),
}
DTYPES: dict[str, frozenset[str]] = {
    "torch": frozenset({"auto", "float32", "float16", "bfloat16"}),
    "onnx": frozenset({"auto", "float32", "float16"}),
    "ctranslate2": frozenset({"auto", "float32", "float16", "int8_float16"}),
}


@dataclass(frozen=True, slots=True)
class Choice:
    """The engine a model runs on and, for `backend: auto`, why."""

    backend: str
    reason: str


def check_static(name: str, backend: str, quantize: str, dtype: str, device: str, kind: Any) -> None:
    """What the configuration alone rules out (raises ValueError, reported as a config error)."""
    kind_name = getattr(kind, "value", kind)
    if backend == "torch" and quantize != "none":
        raise ValueError(
            f"model '{name}': quantize: {quantize} is not available on backend: torch; "
            "use backend: onnx, ctranslate2 or auto for int8"
        )
    if backend in DTYPES and dtype not in DTYPES[backend]:
        raise ValueError(
            f"model '{name}': dtype: {dtype} is not supported by backend: {backend}; "
            f"supported: {', '.join(sorted(DTYPES[backend]))}"
        )
    if dtype == "int8_float16" and (backend != "ctranslate2" or device == "cpu"):
        raise ValueError(f"model '{name}': dtype: int8_float16 needs backend: ctranslate2 on a CUDA device")
    if quantize == "int8" and dtype in ("float16", "bfloat16", "int8_float16"):
        raise ValueError(f"model '{name}': quantize: int8 takes dtype auto or float32, not {dtype}")
    families = FAMILIES.get(backend)
    if families and kind_name != "auto" and kind_name not in families:
        raise ValueError(
            f"model '{name}': kind {kind_name} does not run on backend: {backend}; "
            f"it serves {', '.join(sorted(families))}; use backend: torch for this model"
        )


def check_model(name: str, backend: str, quantize: str, kind: str, config: dict[str, Any]) -> None:
    """What the model's own files rule out: its family and architecture on the chosen engine."""
    if backend == "torch":
        return
    model_type = str(config.get("model_type", "unknown"))
    if kind not in FAMILIES[backend]:
        raise ValueError(
            f"model '{name}': a {kind} model does not run on backend: {backend} "
            f"(it serves {', '.join(sorted(FAMILIES[backend]))}); use backend: torch"
        )
    if model_type not in ARCHITECTURES[backend]:
        fix = "use backend: torch" + ("" if quantize == "none" else " with quantize: none")
        raise ValueError(
            f"model '{name}': architecture '{model_type}' cannot run on backend: {backend} "
            f"(supported: {', '.join(sorted(ARCHITECTURES[backend]))}); {fix}"
        )


def installed(backend: str) -> bool:
    module = {"torch": "torch", "onnx": "onnxruntime", "ctranslate2": "ctranslate2"}[backend]
    return importlib.util.find_spec(module) is not None


def onnx_runs_on_cuda() -> bool:
    """Whether the installed onnxruntime is the build with the CUDA provider (onnxruntime-gpu),
    read from the package metadata: nothing is imported."""
    try:
        importlib.metadata.distribution("onnxruntime-gpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return installed("onnx")


def choose(
    name: str, backend: str, quantize: str, kind: str, config: dict[str, Any], cuda: bool, *, dtype: str = "auto"
) -> Choice:
    """The engine for `backend` (checked), or for `auto` the measured best one that fits.

    The ranking comes from docs/backends.md and is by a single query's latency. On CPU ONNX
    Runtime answers an idle sentence soonest on every host measured but one, where CTranslate2
    int8 was level with it (on AVX2, int8: 8 ms a sentence against 15 for CTranslate2), and
    serves every text family, so it comes first; CTranslate2 serves somewhat more bulk
    throughput, and in int8 both serve 1.4-2.3x the torch path over HTTP (in fp32, on an Intel
    host with AMX, torch served more than ONNX Runtime). On CUDA (an H100) ONNX Runtime in float16
    served 2.3x torch's short sentences over HTTP, as many long documents, and answered an idle
    sentence 3.6 ms sooner, so it comes first where onnxruntime-gpu is installed; int8 on CUDA is
    CTranslate2's int8_float16."""
    if backend != "auto":
        check_model(name, backend, quantize, kind, config)
        return Choice(backend, "configured")
    model_type = str(config.get("model_type", "unknown"))
    onnx_on_cuda = cuda and quantize != "int8" and onnx_runs_on_cuda()
    if not cuda:
        candidates = ["onnx", "ctranslate2"]
    elif quantize == "int8":
        candidates = ["ctranslate2"]
    else:
        candidates = ["onnx"] if onnx_on_cuda else []
    for engine in candidates:
        fits = kind in FAMILIES[engine] and model_type in ARCHITECTURES[engine] and dtype in DTYPES[engine]
        if fits and installed(engine):
            if cuda:
                precision = "int8_float16" if quantize == "int8" else "float32" if dtype == "float32" else "float16"
            else:
                precision = "int8" if quantize == "int8" else "fp32"
            why = "lowest measured latency" if engine == "onnx" else "the measured engine that serves it"
            where = "CUDA" if cuda else "CPU"
            return Choice(engine, f"auto: {why} for {kind} '{model_type}' on {where} in {precision}")
    if quantize == "int8":
        raise ValueError(
            f"model '{name}': quantize: int8 with backend: auto found no engine for a {kind} '{model_type}' "
            "model on this device (int8 runs on onnx (CPU) or ctranslate2 (CPU and CUDA), BERT-family "
            "encoders); set quantize: none"
        )
    if cuda:
        why = (
            f"no faster engine serves {kind} '{model_type}' on CUDA"
            if onnx_on_cuda
            else "onnxruntime's CUDA build is not installed (pip install 'infinity-server[onnx-gpu]')"
        )
    else:
        why = f"no faster engine serves {kind} '{model_type}'"
        if not installed("onnx") and kind in FAMILIES["onnx"]:
            why = "onnxruntime is not installed (pip install 'infinity-server[onnx]')"
    return Choice("torch", f"auto: {why}")
