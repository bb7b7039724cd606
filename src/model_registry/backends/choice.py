"""Which engine runs which model: the support matrix, start-up checks and the `auto` choice (the
default), read from each engine's declaration (`EngineFacts`: what it serves, and where it was
measured fastest per device and CPU kind).

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

from model_registry.backends import declared, facts, names
from model_registry.backends.base import EngineFacts
from model_registry.backends.torch import fp8
from model_registry.zoo.files import is_causal_lm


def general() -> str:
    """The engine that serves every model (torch): `auto`'s last resort."""
    return next(e.name for e in declared() if e.kinds is None and e.architectures is None)


def _others(refused: str) -> list[EngineFacts]:
    """The engines that run some models only, other than `refused`, in declaration order."""
    return [e for e in declared() if e.name != refused and e.name != general()]


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
    if backend == "auto":
        engine = None
    elif backend not in names():
        raise ValueError(f"model '{name}': no backend '{backend}'; expected auto, {', '.join(names())}")
    else:
        engine = facts(backend)
    if engine is not None and quantize not in engine.quantize:
        running = [e.name for e in declared() if quantize in e.quantize]
        raise ValueError(
            f"model '{name}': quantize: {quantize} is not available on backend: {backend}; "
            f"use backend: {', '.join(running)} or auto for {quantize}"
        )
    if engine is not None and dtype not in engine.dtypes:
        raise ValueError(
            f"model '{name}': dtype: {dtype} is not supported by backend: {backend}; "
            f"supported: {', '.join(sorted(engine.dtypes))}"
        )
    holders = [e.name for e in declared() if dtype in e.dtypes]
    if not holders:
        raise ValueError(f"model '{name}': no engine runs dtype: {dtype}")
    if dtype == "int8_float16" and (backend not in holders or device == "cpu"):
        raise ValueError(f"model '{name}': dtype: int8_float16 needs backend: {', '.join(holders)} on a CUDA device")
    if quantize == "int8" and dtype in ("float16", "bfloat16", "int8_float16"):
        raise ValueError(f"model '{name}': quantize: int8 takes dtype auto or float32, not {dtype}")
    kinds = engine.kinds if engine is not None else None
    if kinds and kind_name != "auto" and kind_name not in kinds:
        raise ValueError(
            f"model '{name}': kind {kind_name} does not run on backend: {backend}; "
            f"it serves {', '.join(sorted(kinds))}; use backend: {general()} for this model"
        )


def check_model(name: str, backend: str, quantize: str, kind: str, config: dict[str, Any], device: str = "cpu") -> None:
    """What the model's own files rule out: its family and architecture on the chosen engine."""
    engine = facts(backend)
    if engine.kinds is None and engine.architectures is None:
        return
    model_type = str(config.get("model_type", "unknown"))
    if kind == "reranker" and is_causal_lm([str(a) for a in config.get("architectures") or ()]):
        raise ValueError(
            f"model '{name}': an LLM reranker ('{model_type}' causal LM) runs on backend: {general()} only, which "
            f"computes the two scoring rows of its LM head; use backend: {general()} (or auto), not {backend}"
        )
    if engine.kinds is not None and kind not in engine.kinds:
        raise ValueError(
            f"model '{name}': a {kind} model does not run on backend: {backend} "
            f"(it serves {', '.join(sorted(engine.kinds))}); use backend: {general()}"
        )
    fix = _fix(kind, model_type, device, backend, quantize)
    if engine.architectures is not None and model_type not in engine.architectures:
        raise ValueError(
            f"model '{name}': architecture '{model_type}' cannot run on backend: {backend} "
            f"(supported: {', '.join(sorted(engine.architectures))}); {fix}"
        )
    only = engine.only.get(model_type)
    if only is not None and kind not in only:
        raise ValueError(
            f"model '{name}': backend: {backend} runs '{model_type}' as {', '.join(sorted(only))} only, "
            f"not as a {kind} model; {fix}"
        )
    if own_code(config) and engine.converts:
        raise ValueError(
            f"model '{name}': its own code runs it (config.json's auto_map), and backend: {backend} converts "
            f"'{model_type}' as its own implementation of that architecture, without that code, which would "
            f"answer other vectors; {fix}"
        )
    why = engine.not_on_cuda.get(model_type)
    if why is not None and device.startswith("cuda"):
        raise ValueError(f"model '{name}': '{model_type}' cannot run on backend: {backend} on CUDA ({why}); {fix}")


def serves(engine: str, kind: str, model_type: str, device: str = "cpu", config: dict[str, Any] | None = None) -> bool:
    """Whether `engine` runs a `kind` model of `model_type` on `device` (torch runs every one);
    with `config`, also whether it runs the code the model's files name."""
    declared_facts = facts(engine)
    if config is not None and own_code(config) and declared_facts.converts:
        return False
    kinds = declared_facts.kinds
    kind_ok = (kinds is None or kind in kinds) and kind in declared_facts.only.get(model_type, {kind})
    architectures = declared_facts.architectures
    architecture_ok = architectures is None or model_type in architectures
    cuda_ok = not device.startswith("cuda") or model_type not in declared_facts.not_on_cuda
    return kind_ok and architecture_ok and cuda_ok


def own_code(config: dict[str, Any]) -> bool:
    """Whether the model's files name code of their own (`auto_map`) to run it."""
    return bool(config.get("auto_map"))


def _fix(kind: str, model_type: str, device: str, refused: str, quantize: str) -> str:
    """`use backend: onnx, or backend: torch`: the engines other than `refused` that run this model."""
    others = [f"backend: {e.name}" for e in _others(refused) if serves(e.name, kind, model_type, device)]
    last = f"backend: {general()}" + ("" if quantize == "none" else " with quantize: none")
    return "use " + ", or ".join([*others, last])


def installed(backend: str) -> bool:
    return importlib.util.find_spec(facts(backend).probe) is not None


def cuda_build_installed(backend: str) -> bool:
    """Whether the engine's CUDA build is installed where it has one of its own (onnxruntime-gpu),
    read from the package metadata: nothing is imported."""
    build = facts(backend).cuda_build
    if build is None:
        return installed(backend)
    try:
        importlib.metadata.distribution(build[0])
    except importlib.metadata.PackageNotFoundError:
        return False
    return installed(backend)


#: How `auto` tells CPUs apart: by the `/proc/cpuinfo` flags that separated the hosts measured,
#: first match wins; a CPU with none of them (no AVX2, or not x86) is `cpu/other`.
CPU_KINDS: tuple[tuple[str, frozenset[str]], ...] = (
    ("amx", frozenset({"amx_tile", "amx_int8", "amx_bf16"})),
    ("avx512_vnni", frozenset({"avx512_vnni"})),
    ("avx2", frozenset({"avx2"})),
)


def fastest_table() -> dict[tuple[str, str], tuple[str, ...]]:
    """The engines `auto` tries, in order, per host and precision, from each engine's measured
    standing (`EngineFacts.fastest`: those that served torch's figure or more over HTTP on that
    kind of host for short sentences and long documents alike). A `cpu` row holds for every CPU
    kind without a row of its own; a host and precision without a row, or whose engines do not
    serve the model, run on torch. int8 is never chosen for a model, only honoured where
    `quantize: int8` asks for it."""
    return _standing(tuple((e.name, e.fastest) for e in declared()))


def fastest_for_table() -> dict[str, dict[tuple[str, str], tuple[str, ...]]]:
    """Per architecture measured on its own (`EngineFacts.fastest_for`): its rows, in place of
    `fastest_table`'s. A host or precision not measured for it runs it on torch."""
    architectures = sorted({a for e in declared() for a in e.fastest_for})
    return {a: _standing(tuple((e.name, e.fastest_for.get(a, {})) for e in declared())) for a in architectures}


def _standing(
    places: tuple[tuple[str, dict[tuple[str, str], int | None]], ...],
) -> dict[tuple[str, str], tuple[str, ...]]:
    rows: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for engine, standing in places:
        for where, place in standing.items():
            rows.setdefault(where, [])
            if place is not None:
                rows[where].append((place, engine))
    return {where: tuple(engine for _, engine in sorted(found)) for where, found in rows.items()}


_HOSTS = {
    "cpu/amx": "an AMX CPU",
    "cpu/avx512_vnni": "an AVX-512 VNNI CPU",
    "cpu/avx2": "an AVX2 CPU",
    "cpu/other": "a CPU without AVX2",
    "cuda": "CUDA",
}


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
    """The precision a converting engine would run in: the second key of `fastest_table`."""
    cuda = host == "cuda"
    if quantize == "int8":
        return "int8_float16" if cuda else "int8"
    if dtype == "auto":
        return "float16" if cuda else "fp32"
    return "fp32" if dtype == "float32" and not cuda else dtype


def available(engine: str, host: str) -> bool:
    """Whether `engine` is installed for `host` (on CUDA, its CUDA build where it has one)."""
    return cuda_build_installed(engine) if host == "cuda" else installed(engine)


def missing(engine: str, host: str) -> str:
    """What to install for `engine` on `host`, as `auto`'s reason says it."""
    declared_facts = facts(engine)
    package, extra = declared_facts.probe, declared_facts.extra
    if host == "cuda" and declared_facts.cuda_build is not None:
        package, extra = declared_facts.cuda_build
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
        runner = next(e.name for e in declared() if "fp8" in e.quantize)
        return (Choice(runner, "configured" if backend == runner else f"auto: {runner}, the engine that runs fp8"),)
    if backend != "auto":
        check_model(name, backend, quantize, kind, config, device)
        return (Choice(backend, "configured"),)
    host = host or host_kind(device)
    model_type = str(config.get("model_type", "unknown"))
    precision = precision_of(host, quantize, dtype)
    listed = fastest(host, precision, model_type)
    serving = [e for e in listed if serves(e, kind, model_type, host, config) and dtype in facts(e).dtypes]
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
            f"model on this device (int8 runs on {_int8_where()}, for the families and architectures each "
            "serves, with its extra installed); set quantize: none"
        )
    last = general()
    if found:
        why = "the engine that serves every model"
    elif serving:
        why = missing(serving[0], host)
    elif listed:
        why = f"no engine measured faster serves {kind} '{model_type}' on {where}"
    else:
        why = _torch_measured(host, precision, model_type)
    return (*found, Choice(last, f"auto: {last}, {why}"))


def _int8_where() -> str:
    """`onnx (CPU) or ctranslate2 (CPU and CUDA)`: where each engine runs int8 for `auto`."""
    said = []
    for engine in declared():
        hosts = [h.upper() for (h, p), place in engine.fastest.items() if p.startswith("int8") and place is not None]
        if hosts:
            said.append(f"{engine.name} ({' and '.join(hosts)})")
    return " or ".join(said)


def _torch_measured(host: str, precision: str, model_type: str) -> str:
    """Why `auto` found no engine to try: torch measured fastest, or the architecture not measured."""
    where = _HOSTS.get(host, host)
    measured = fastest_for_table()
    if model_type not in measured:
        return f"no engine measured faster than {general()} on {where} in {precision}"
    if (host, precision) in measured[model_type]:
        return f"no engine measured faster than {general()} for '{model_type}' on {where} in {precision}"
    return f"engines not measured for '{model_type}' on {where} in {precision}"


def fastest(host: str, precision: str, model_type: str) -> tuple[str, ...]:
    """The engines `auto` tries, in order: the architecture's own row where it was measured on its
    own (`fastest_for_table`; none there for a host or precision it lacks), else `fastest_table`'s.
    int8 keeps `fastest_table`'s row: it is asked for, and torch cannot run it."""
    own = fastest_for_table().get(model_type)
    if own is not None and not precision.startswith("int8"):
        return own.get((host, precision), ())
    table = fastest_table()
    return table.get((host, precision), table.get((host.split("/")[0], precision), ()))


#: The device kinds the engine tables were measured on, each in the precision `auto` runs there.
MEASURED_HOSTS = {"cpu/avx2": "fp32", "cpu/avx512_vnni": "fp32", "cpu/amx": "fp32", "cuda": "float16"}


def fastest_by_device(kind: str, model_type: str, *, llm_reranker: bool = False) -> dict[str, str]:
    """Per device kind, the engine and precision `auto` takes for a `kind` model of `model_type`
    with every engine installed (`{"cpu/avx2": "ctranslate2 fp32"}`); device kinds where the
    architecture has no figures of its own (`fastest_for_table`) while others have are left out.
    LLM rerankers run on torch only (`check_model`)."""
    own = fastest_for_table().get(model_type)
    chosen = {}
    for host, precision in MEASURED_HOSTS.items():
        if own is not None and (host, precision) not in own:
            continue
        engine = general() if llm_reranker else auto_engine(host, precision, kind, model_type)
        chosen[host] = f"{engine} {precision}"
    return chosen


def auto_engine(host: str, precision: str, kind: str, model_type: str, config: dict[str, Any] | None = None) -> str:
    """The engine `auto` takes on `host` in `precision` with every engine installed: the first of
    `fastest` that serves the model (`config` given: its own code included), else torch."""
    served = (e for e in fastest(host, precision, model_type) if serves(e, kind, model_type, host, config))
    return next(served, general())


def catalogue_listing() -> list[dict[str, Any]]:
    """The catalogue's records as listed (`GET /v1/catalogue`, `infinity-server models
    --catalogue`), each with `fastest`: its engine per device kind (a record's own `engine` on each,
    where it names one)."""
    from model_registry.zoo.catalogue import RECORDS

    return [
        {
            **r.as_dict(),
            "fastest": dict.fromkeys(MEASURED_HOSTS, r.engine)
            if r.engine
            else fastest_by_device(r.kind, r.architecture, llm_reranker=r.template is not None),
        }
        for r in RECORDS.values()
    ]
