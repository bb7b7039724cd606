"""Which engine runs which model: the support matrix, start-up checks and the `auto` choice (the
default), made from the table of engines measured fastest per device and CPU kind (`FASTEST`).

Nothing here imports an engine; the checks read only the configuration and the model's
`config.json`, so a bad combination fails when the server starts, naming the model, the
combination and what is supported.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model_registry.backends import fp8
from model_registry.detect_zoo import is_causal_lm

#: Families (the adapters' kinds) each engine serves. CLIP, CLAP, ColPali stay on torch.
FAMILIES: dict[str, frozenset[str]] = {
    "torch": frozenset(),  # every kind
    "onnx": frozenset({"dense", "reranker", "classifier", "sparse", "multivector", "multi_output"}),
    "ctranslate2": frozenset({"dense", "reranker", "classifier"}),
}
#: Architectures (config.json `model_type`) each converting engine handles.
ARCHITECTURES: dict[str, frozenset[str]] = {
    "onnx": frozenset(
        {"bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra", "mpnet"}
        | {"modernbert", "nomic_bert", "qwen3", "gemma3_text", "jina_embeddings_v3"}
    ),
    "ctranslate2": frozenset({"bert", "xlm-roberta", "roberta", "camembert", "distilbert"}),
}
#: Architectures an engine serves for some families only (the others: every family it serves),
#: as far as the parity tests cover them (tests/engines/families.py). The decoders' and nomic's
#: exports are embedders: their last hidden state, pooled by the adapter.
ONLY: dict[tuple[str, str], frozenset[str]] = {
    ("onnx", "modernbert"): frozenset({"dense", "reranker", "multivector"}),
    ("onnx", "nomic_bert"): frozenset({"dense"}),
    ("onnx", "qwen3"): frozenset({"dense"}),
    ("onnx", "gemma3_text"): frozenset({"dense"}),
    # jina-embeddings-v3, its task adapters in the graph (`backends/lora.py`)
    ("onnx", "jina_embeddings_v3"): frozenset({"dense"}),
}
#: Architectures an engine cannot run on CUDA, and why: ONNX Runtime runs float16 there, and
#: Gemma 3's activations overflow it (EmbeddingGemma's model card: float32 or bfloat16 only).
NOT_ON_CUDA: dict[tuple[str, str], str] = {
    ("onnx", "gemma3_text"): "Gemma 3's activations overflow float16, the precision it runs on CUDA",
}
#: Engines that convert a model by its `model_type` into their own implementation, so that a
#: checkpoint run by code of its own (`auto_map`, `trust_remote_code`) would lose that code:
#: CTranslate2 converts such a BERT as its own BERT. ONNX Runtime's export traces the model's code.
IGNORES_OWN_CODE = frozenset({"ctranslate2"})
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
    if quantize == "fp8":
        fp8.check_options(name, backend, dtype, device, kind_name)
    if backend == "torch" and quantize == "int8":
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


def check_model(name: str, backend: str, quantize: str, kind: str, config: dict[str, Any], device: str = "cpu") -> None:
    """What the model's own files rule out: its family and architecture on the chosen engine."""
    if backend == "torch":
        return
    model_type = str(config.get("model_type", "unknown"))
    if kind == "reranker" and is_causal_lm([str(a) for a in config.get("architectures") or ()]):
        raise ValueError(
            f"model '{name}': an LLM reranker ('{model_type}' causal LM) runs on backend: torch only, which "
            f"computes the two scoring rows of its LM head; use backend: torch (or auto), not {backend}"
        )
    if kind not in FAMILIES[backend]:
        raise ValueError(
            f"model '{name}': a {kind} model does not run on backend: {backend} "
            f"(it serves {', '.join(sorted(FAMILIES[backend]))}); use backend: torch"
        )
    fix = _fix(kind, model_type, device, backend, quantize)
    if model_type not in ARCHITECTURES[backend]:
        raise ValueError(
            f"model '{name}': architecture '{model_type}' cannot run on backend: {backend} "
            f"(supported: {', '.join(sorted(ARCHITECTURES[backend]))}); {fix}"
        )
    only = ONLY.get((backend, model_type))
    if only is not None and kind not in only:
        raise ValueError(
            f"model '{name}': backend: {backend} runs '{model_type}' as {', '.join(sorted(only))} only, "
            f"not as a {kind} model; {fix}"
        )
    if own_code(config) and backend in IGNORES_OWN_CODE:
        raise ValueError(
            f"model '{name}': its own code runs it (config.json's auto_map), and backend: {backend} converts "
            f"'{model_type}' as its own implementation of that architecture, without that code, which would "
            f"answer other vectors; {fix}"
        )
    why = NOT_ON_CUDA.get((backend, model_type))
    if why is not None and device.startswith("cuda"):
        raise ValueError(f"model '{name}': '{model_type}' cannot run on backend: {backend} on CUDA ({why}); {fix}")


def serves(engine: str, kind: str, model_type: str, device: str = "cpu", config: dict[str, Any] | None = None) -> bool:
    """Whether `engine` runs a `kind` model of `model_type` on `device` (torch runs every one);
    with `config`, also whether it runs the code the model's files name."""
    if engine == "torch":
        return True
    if config is not None and own_code(config) and engine in IGNORES_OWN_CODE:
        return False
    only = ONLY.get((engine, model_type), FAMILIES[engine])
    cuda_ok = not device.startswith("cuda") or (engine, model_type) not in NOT_ON_CUDA
    return kind in FAMILIES[engine] and kind in only and model_type in ARCHITECTURES[engine] and cuda_ok


def own_code(config: dict[str, Any]) -> bool:
    """Whether the model's files name code of their own (`auto_map`) to run it."""
    return bool(config.get("auto_map"))


def _fix(kind: str, model_type: str, device: str, refused: str, quantize: str) -> str:
    """`use backend: onnx, or backend: torch`: the engines other than `refused` that run this model."""
    others = [f"backend: {e}" for e in ("onnx", "ctranslate2") if e != refused and serves(e, kind, model_type, device)]
    torch = "backend: torch" + ("" if quantize == "none" else " with quantize: none")
    return "use " + ", or ".join([*others, torch])


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


#: How `auto` tells CPUs apart: by the `/proc/cpuinfo` flags that separated the hosts measured,
#: first match wins; a CPU with none of them (no AVX2, or not x86) is `cpu/other`.
CPU_KINDS: tuple[tuple[str, frozenset[str]], ...] = (
    ("amx", frozenset({"amx_tile", "amx_int8", "amx_bf16"})),
    ("avx512_vnni", frozenset({"avx512_vnni"})),
    ("avx2", frozenset({"avx2"})),
)
#: The engines `auto` tries, in order, per host and precision: those that served torch's figure or
#: more over HTTP on that kind of host for short sentences and long documents alike (a gap within a
#: run's spread counts as level), and more of one. The figures behind each row are in
#: docs/backends.md, "How to pick". A `cpu` row holds for every CPU kind without a row of its own;
#: a host and precision without a row, or whose engines do not serve the model, run on torch.
FASTEST: dict[tuple[str, str], tuple[str, ...]] = {
    ("cpu/avx2", "fp32"): ("ctranslate2",),
    ("cpu/avx512_vnni", "fp32"): ("ctranslate2", "onnx"),
    ("cpu/amx", "fp32"): (),
    ("cuda", "float16"): ("onnx",),
    # int8 is never chosen for a model, only honoured where `quantize: int8` asks for it.
    ("cpu", "int8"): ("ctranslate2", "onnx"),
    ("cuda", "int8_float16"): ("ctranslate2",),
}
#: Architectures measured on their own, with a random model of their smallest published size
#: (`benchmarks/bench_onnx_families.py`): per host and precision, the engines `auto` tries for them
#: in place of `FASTEST`'s row, by `FASTEST`'s rule. A host or precision not measured runs them on
#: torch. The figures: docs/backends.md, "Per architecture".
FASTEST_FOR: dict[str, dict[tuple[str, str], tuple[str, ...]]] = {
    # ONNX Runtime fp32 0.94x torch on short inputs, 0.88x on long ones
    "modernbert": {("cpu/avx2", "fp32"): ()},
    # 0.91x, 0.85-0.88x
    "nomic_bert": {("cpu/avx2", "fp32"): ()},
    # 1.01-1.06x, 0.95-1.00x: level, and an export of minutes
    "qwen3": {("cpu/avx2", "fp32"): ()},
    # 1.03-1.12x, 0.98-1.03x: level within two runs' spread
    "gemma3_text": {("cpu/avx2", "fp32"): ()},
    # jina-embeddings-v3, its task adapters in the graph: 0.94-1.03x, 0.95-1.00x: level
    "jina_embeddings_v3": {("cpu/avx2", "fp32"): ()},
}
_HOSTS = {
    "cpu/amx": "an AMX CPU",
    "cpu/avx512_vnni": "an AVX-512 VNNI CPU",
    "cpu/avx2": "an AVX2 CPU",
    "cpu/other": "a CPU without AVX2",
    "cuda": "CUDA",
}
_EXTRAS = {"onnx": ("onnxruntime", "onnx"), "ctranslate2": ("ctranslate2", "ctranslate2")}


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This machine's CPU flags as `/proc/cpuinfo` lists them (`flags`, or `Features` on Arm);
    empty where there is no such file."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def host_kind(device: str, flags: frozenset[str] | None = None) -> str:
    """`cuda`, `cpu/<kind>` (`CPU_KINDS`, from this machine's flags unless given), or the device
    itself where no engine but torch was measured (`mps`)."""
    if device.startswith("cuda"):
        return "cuda"
    if device != "cpu":
        return device
    present = cpu_flags() if flags is None else flags
    return next((f"cpu/{kind}" for kind, marks in CPU_KINDS if present & marks), "cpu/other")


def precision_of(host: str, quantize: str, dtype: str) -> str:
    """The precision a converting engine would run in: `FASTEST`'s second key."""
    cuda = host == "cuda"
    if quantize == "int8":
        return "int8_float16" if cuda else "int8"
    if dtype == "auto":
        return "float16" if cuda else "fp32"
    return "fp32" if dtype == "float32" and not cuda else dtype


def available(engine: str, host: str) -> bool:
    """Whether `engine` is installed for `host` (on CUDA, ONNX Runtime needs its CUDA build)."""
    return onnx_runs_on_cuda() if (engine, host) == ("onnx", "cuda") else installed(engine)


def missing(engine: str, host: str) -> str:
    """What to install for `engine` on `host`, as `auto`'s reason says it."""
    package, extra = _EXTRAS[engine]
    if (engine, host) == ("onnx", "cuda"):
        package, extra = "onnxruntime-gpu", "onnx-gpu"
    return f"{package} is not installed (pip install 'infinity-server[{extra}]')"


def choose(
    name: str,
    backend: str,
    quantize: str,
    kind: str,
    config: dict[str, Any],
    device: str,
    *,
    dtype: str = "auto",
    host: str | None = None,
) -> Choice:
    """The engine for `backend` (checked), or for `auto` the first engine of `fastest` for the
    host (`host_kind(device)` unless given) that serves the model and is installed, else torch.
    fp8 runs on torch alone; whether the device runs it is the engine's check, at load."""
    return choices(name, backend, quantize, kind, config, device, dtype=dtype, host=host)[0]


def choices(
    name: str,
    backend: str,
    quantize: str,
    kind: str,
    config: dict[str, Any],
    device: str,
    *,
    dtype: str = "auto",
    host: str | None = None,
) -> tuple[Choice, ...]:
    """The engines to try, in order: the configured one alone, or for `auto` every engine of
    `fastest` for the host that serves the model and is installed, then torch (which serves every
    model; not for int8, which it cannot run). An engine that fails to build or load the model
    hands over to the next (`adapters.dense.TextEncoder`)."""
    if quantize == "fp8":
        fp8.check_options(name, backend, dtype, "auto", kind)
        return (Choice("torch", "configured" if backend == "torch" else "auto: torch, the engine that runs fp8"),)
    if backend != "auto":
        check_model(name, backend, quantize, kind, config, device)
        return (Choice(backend, "configured"),)
    host = host or host_kind(device)
    model_type = str(config.get("model_type", "unknown"))
    precision = precision_of(host, quantize, dtype)
    listed = fastest(host, precision, model_type)
    serving = [e for e in listed if serves(e, kind, model_type, host, config) and dtype in DTYPES[e]]
    where = _HOSTS.get(host, host)
    found = tuple(
        Choice(engine, f"auto: {engine}, fastest measured engine for {kind} '{model_type}' on {where} in {precision}")
        for engine in serving
        if available(engine, host)
    )
    if quantize == "int8":
        if found:
            return found
        raise ValueError(
            f"model '{name}': quantize: int8 with backend: auto found no engine for a {kind} '{model_type}' "
            "model on this device (int8 runs on onnx (CPU) or ctranslate2 (CPU and CUDA), for the families "
            "and architectures each serves, with its extra installed); set quantize: none"
        )
    if found:
        last = Choice("torch", "auto: torch, the engine that serves every model")
    elif serving:
        last = Choice("torch", f"auto: torch, {missing(serving[0], host)}")
    elif listed:
        last = Choice("torch", f"auto: torch, no engine measured faster serves {kind} '{model_type}' on {where}")
    else:
        last = Choice("torch", f"auto: torch, {_torch_measured(host, precision, model_type)}")
    return (*found, last)


def _torch_measured(host: str, precision: str, model_type: str) -> str:
    """Why `auto` found no engine to try: torch measured fastest, or the architecture not measured."""
    where = _HOSTS.get(host, host)
    if model_type not in FASTEST_FOR:
        return f"no engine measured faster than torch on {where} in {precision}"
    if (host, precision) in FASTEST_FOR[model_type]:
        return f"no engine measured faster than torch for '{model_type}' on {where} in {precision}"
    return f"engines not measured for '{model_type}' on {where} in {precision}"


def fastest(host: str, precision: str, model_type: str) -> tuple[str, ...]:
    """The engines `auto` tries, in order: the architecture's own row where it was measured on its
    own (`FASTEST_FOR`; none there for a host or precision it lacks), else `FASTEST`'s. int8 keeps
    `FASTEST`'s row: it is asked for, and torch cannot run it."""
    own = FASTEST_FOR.get(model_type)
    if own is not None and not precision.startswith("int8"):
        return own.get((host, precision), ())
    return FASTEST.get((host, precision), FASTEST.get((host.split("/")[0], precision), ()))


#: The device kinds the engine tables were measured on, each in the precision `auto` runs there.
MEASURED_HOSTS = {"cpu/avx2": "fp32", "cpu/avx512_vnni": "fp32", "cpu/amx": "fp32", "cuda": "float16"}


def fastest_by_device(kind: str, model_type: str, *, llm_reranker: bool = False) -> dict[str, str]:
    """Per device kind, the engine and precision `auto` takes for a `kind` model of `model_type`
    with every engine installed (`{"cpu/avx2": "ctranslate2 fp32"}`); device kinds where the
    architecture has no figures of its own (`FASTEST_FOR`) while others have are left out. LLM
    rerankers run on torch only (`check_model`)."""
    own = FASTEST_FOR.get(model_type)
    chosen = {}
    for host, precision in MEASURED_HOSTS.items():
        if own is not None and (host, precision) not in own:
            continue
        engine = "torch" if llm_reranker else auto_engine(host, precision, kind, model_type)
        chosen[host] = f"{engine} {precision}"
    return chosen


def auto_engine(host: str, precision: str, kind: str, model_type: str, config: dict[str, Any] | None = None) -> str:
    """The engine `auto` takes on `host` in `precision` with every engine installed: the first of
    `fastest` that serves the model (`config` given: its own code included), else torch."""
    served = (e for e in fastest(host, precision, model_type) if serves(e, kind, model_type, host, config))
    return next(served, "torch")


def catalogue_listing() -> list[dict[str, Any]]:
    """The catalogue's records as listed (`GET /v1/catalogue`, `infinity-server models
    --catalogue`), each with `fastest`: its engine per device kind (a record's own `engine` on each,
    where it names one)."""
    from model_registry.catalogue import RECORDS

    return [
        {
            **r.as_dict(),
            "fastest": dict.fromkeys(MEASURED_HOSTS, r.engine)
            if r.engine
            else fastest_by_device(r.kind, r.architecture, llm_reranker=r.template is not None),
        }
        for r in RECORDS.values()
    ]
