"""Building the ONNX artifact a model runs on: export, optimize, then float16 or int8.

int8 is dynamic quantization of the weight MatMuls only, with one scale per output channel and
the full int8 range. Quantizing the attention's activation x activation MatMuls (what
`quantize_dynamic` does by default) and per-tensor scales cost most of the accuracy on MiniLM;
the measurements behind this recipe are in docs/backends.md.
"""

from __future__ import annotations

import importlib.metadata
import logging
import shutil
import warnings
from pathlib import Path
from typing import Any

from model_registry.backends import build_process
from model_registry.backends.base import EngineOptions, Task
from model_registry.backends.cache import UnsafeCache, artifact_key, cached, check_artifact, is_complete, writable_root

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
#: A graph whose files exceed this keeps its weights beside it, in `DATA`: protobuf cannot hold a
#: file over 2 GiB (Qwen3-Embedding-0.6B in float32 is 2.4 GB), and the optimizer's copies add to it.
LARGE = 1 << 30
DATA = "model.onnx.data"
#: Where an int8 build finds the float32 artifact's graph it quantizes (see `float_artifact`).
FLOAT = "float32"
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
    meta: dict[str, Any] = {"source": str(directory), **build_options, **versions()}

    def build(staging: Path) -> None:
        base = float_artifact(root, directory, options) if options.quantize == "int8" else None
        if base is not None:
            _copy_graph(base, staging / FLOAT)
            meta["quantized_from"] = base.name  # the manifest is written after the build, with this
        build_artifact(directory, options, fp16, staging)

    return cached(root, "onnx", key, build, meta=meta)


def float_artifact(root: Path, directory: Path, options: EngineOptions) -> Path | None:
    """The float32 artifact of the same model and task where one is built and sound: its graph is
    the export and optimization that int8 quantizes, so int8 starts from it instead of exporting
    again (an export of Qwen3-Embedding-0.6B takes minutes)."""
    build_options = {"task": options.task, "quantize": "none", "fp16": False, "recipe": RECIPE}
    artifact = root / "onnx" / artifact_key(directory, versions(), build_options)
    try:
        check_artifact(artifact)
    except (OSError, UnsafeCache):
        return None
    return artifact if is_complete(artifact) else None


def _copy_graph(artifact: Path, target: Path) -> None:
    target.mkdir()
    for name in ("model.onnx", DATA):
        if (artifact / name).is_file():
            shutil.copyfile(artifact / name, target / name)


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
    """Export (or copy the directory's own graph), optimize, then quantize, into `staging`; int8
    quantizes the float32 artifact's graph where `artifact_for` put one in `staging/FLOAT`."""
    source, target = Path(directory), Path(staging)
    final = target / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporters' deprecation chatter is not the user's concern
        base = target / FLOAT / "model.onnx"
        if quantize == "int8" and base.is_file():
            log.info("quantizing %s to int8 from its float32 artifact", source)
            quantize_int8(base, final, large=_size(base.parent) > LARGE)
        else:
            exported = _exported(source, target, task, trust_remote_code)
            large = _size(target) > LARGE
            if quantize == "int8":
                log.info("quantizing %s to int8 (dynamic, per channel, weight MatMuls)", source)
                quantize_int8(optimize(exported, target / "optimized.onnx", fp16, large), final, large=large)
            else:
                optimize(exported, final, fp16, large)
    for leftover in target.iterdir():
        if leftover.name not in (final.name, DATA):
            if leftover.is_dir():
                shutil.rmtree(leftover)
            else:
                leftover.unlink()


def _exported(source: Path, target: Path, task: Task, trust_remote_code: bool) -> Path:
    """The model's graph in `target`: the directory's own `onnx/model.onnx`, else an export."""
    from model_registry.backends.onnx.export import export

    exported = target / "exported.onnx"
    own = source / "onnx" / "model.onnx"
    if own.is_file():
        shutil.copyfile(own, exported)
    else:
        export(source, task, exported, trust_remote_code=trust_remote_code)
    return exported


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


def optimize(source: Path, target: Path, fp16: bool, large: bool = False) -> Path:
    """onnxruntime's transformer fusions (LayerNorm, GELU, attention where the graph matches),
    then float16 for CUDA, written to `target`. A graph the optimizer cannot take is written as
    exported, in float16 all the same where asked. `large`: the weights go to a file of their own
    beside the graph (`<target>.data`)."""
    model = _fused(source)
    if model is None:
        import onnx
        from onnxruntime.transformers.onnx_model import OnnxModel

        model = OnnxModel(onnx.load(str(source)))
    if fp16:
        model.convert_float_to_float16(keep_io_types=True)
    model.save_model_to_file(str(target), use_external_data_format=large)
    return target


def _fused(source: Path) -> Any:
    """The graph with onnxruntime's fusions for BERT-like encoders, or None where they fail. A
    layer norm without a bias (ModernBERT's) breaks the SkipLayerNormalization fusion, so a
    failure is retried without that one."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    failure: Exception | None = None
    for skip_layer_norm in (True, False):
        options = FusionOptions("bert")
        options.enable_skip_layer_norm = skip_layer_norm
        try:
            model = optimize_model(
                str(source), model_type="bert", num_heads=0, hidden_size=0, opt_level=1, optimization_options=options
            )
        except Exception as error:
            failure = failure or error
            continue
        fused = {k: v for k, v in model.get_fused_operator_statistics().items() if v}
        log.info("onnxruntime transformer fusions: %s", fused or "none matched")
        return model
    log.warning("onnxruntime's transformer optimizer failed (%s); using the exported graph", failure)
    return None


def weight_matmuls(path: Path) -> list[Any]:
    """MatMul/Gemm nodes whose second input is a weight (an initializer), in graph order."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    weights = {i.name for i in model.graph.initializer}
    weights |= {n.output[0] for n in model.graph.node if n.op_type == "Constant"}
    return [n for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in weights]


def quantize_int8(
    source: Path, target: Path, keep_float: frozenset[str] = INT8_KEEP_FLOAT, *, large: bool = False
) -> None:
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
        use_external_data_format=large,
    )
