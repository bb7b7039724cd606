"""Building the ONNX artifact a model runs on: export, optimize, then float16 or int8.

int8 is dynamic quantization of the weight MatMuls only, with one scale per output channel and
the full int8 range. Quantizing the attention's activation x activation MatMuls (what
`quantize_dynamic` does by default) and per-tensor scales cost most of the accuracy on MiniLM;
the measurements behind this recipe are in docs/backends.md.
"""

from __future__ import annotations

import importlib.metadata
import logging
import warnings
from pathlib import Path
from typing import Any

from model_registry.backends import build_process
from model_registry.backends.base import EngineOptions, Task
from model_registry.backends.cache import artifact_key, cached, writable_root

log = logging.getLogger(__name__)

OUTPUT: dict[Task, str] = {
    "feature-extraction": "last_hidden_state",
    "sequence-classification": "logits",
    "masked-lm": "logits",
}
#: Bumped whenever the build steps change, so that old artifacts are not reused.
RECIPE = "export-dynamo+ort-optimizer+int8-weight-matmul-per-channel:3"
#: Weight MatMuls kept in float32 under int8 (empty: all quantized). See docs/backends.md.
INT8_KEEP_FLOAT: frozenset[str] = frozenset()
_LIBRARIES = ("torch", "transformers", "onnx", "onnxscript", "onnxruntime")


def versions() -> dict[str, str]:
    found = {}
    for name in _LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "absent"
    return found


def artifact_for(directory: Path, options: EngineOptions, fp16: bool) -> Path:
    """The cached artifact directory (holding model.onnx) for `directory` and these options."""
    build_options = {"task": options.task, "quantize": options.quantize, "fp16": fp16, "recipe": RECIPE}
    key = artifact_key(directory, versions(), build_options)
    root = writable_root(options.cache_dir)

    def build(staging: Path) -> None:
        build_artifact(directory, options, fp16, staging)

    return cached(root, "onnx", key, build, meta={"source": str(directory), **build_options, **versions()})


def build_artifact(directory: Path, options: EngineOptions, fp16: bool, staging: Path) -> None:
    """The artifact in `staging`, built by `build_here` in a child process (see `build_process`)."""
    build_process.run(
        f"{__name__}:build_here",
        directory=str(directory),
        staging=str(staging),
        task=options.task,
        quantize=options.quantize,
        fp16=fp16,
        trust_remote_code=options.trust_remote_code,
    )


def build_here(directory: str, staging: str, task: Task, quantize: str, fp16: bool, trust_remote_code: bool) -> None:
    """Export (or copy the directory's own graph), optimize, then quantize, into `staging`."""
    from model_registry.backends.onnx_export import export

    source, target = Path(directory), Path(staging)
    exported = target / "exported.onnx"
    own = source / "onnx" / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporters' deprecation chatter is not the user's concern
        if own.is_file():
            import shutil

            shutil.copyfile(own, exported)
        else:
            export(source, task, exported, trust_remote_code=trust_remote_code)
        optimized = optimize(exported, target / "optimized.onnx", fp16)
        if quantize == "int8":
            log.info("quantizing %s to int8 (dynamic, per channel, weight MatMuls)", source)
            quantize_int8(optimized, target / "model.onnx")
        else:
            optimized.rename(target / "model.onnx")
    for leftover in target.glob("*.onnx"):
        if leftover.name != "model.onnx":
            leftover.unlink()


def optimize(source: Path, target: Path, fp16: bool) -> Path:
    """onnxruntime's transformer fusions (LayerNorm, GELU, attention where the graph matches),
    then float16 for CUDA. A graph the optimizer cannot take is used as exported."""
    from onnxruntime.transformers.optimizer import optimize_model

    try:
        model = optimize_model(str(source), model_type="bert", num_heads=0, hidden_size=0, opt_level=1)
        fused = {k: v for k, v in model.get_fused_operator_statistics().items() if v}
        log.info("onnxruntime transformer fusions: %s", fused or "none matched")
        if fp16:
            model.convert_float_to_float16(keep_io_types=True)
        model.save_model_to_file(str(target))
        return target
    except Exception as error:
        log.warning("onnxruntime's transformer optimizer failed (%s); using the exported graph", error)
        if fp16:
            raise
        return source


def weight_matmuls(path: Path) -> list[Any]:
    """MatMul/Gemm nodes whose second input is a weight (an initializer), in graph order."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    weights = {i.name for i in model.graph.initializer}
    weights |= {n.output[0] for n in model.graph.node if n.op_type == "Constant"}
    return [n for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in weights]


def quantize_int8(source: Path, target: Path, keep_float: frozenset[str] = INT8_KEEP_FLOAT) -> None:
    """Dynamic int8 of the weight MatMuls; `keep_float` names roles to keep in float32
    ('last': the last weight MatMul of the graph, 'ffn_out': MatMuls fed by an activation)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    nodes = weight_matmuls(source)
    keep: set[str] = set()
    if "last" in keep_float and nodes:
        keep.add(nodes[-1].name)
    if "ffn_out" in keep_float:
        keep |= {n.name for n in nodes if any(s in n.input[0].lower() for s in ("gelu", "erf", "mul", "act"))}
    quantize_dynamic(
        str(source),
        str(target),
        weight_type=QuantType.QInt8,
        per_channel=True,
        reduce_range=False,
        nodes_to_quantize=[n.name for n in nodes if n.name not in keep],
        extra_options={"MatMulConstBOnly": True},
    )
