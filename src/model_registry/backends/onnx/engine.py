"""The ONNX Runtime engine: the model's own ONNX files, or an export cached on disk.

Where the model directory has the common `onnx/model.onnx` layout (and, for int8, one of its
quantized variants) those files run as they are. Otherwise the model is exported once with torch's
dynamo exporter, optimized with onnxruntime's transformer fusions and, for `quantize: int8`,
dynamically quantized (see `build`), into the engine cache. On CUDA the graph is converted
to float16 and runs on the CUDA execution provider with IO binding.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import psutil

from model_registry.backends.base import TASK_INPUT, EncoderBatch, EncoderOutput, Engine, EngineOptions, Task
from model_registry.backends.cache import invalidate, load_failed
from model_registry.backends.devices import compute_slot
from model_registry.backends.onnx.build import OUTPUT, artifact_for
from model_registry.backends.threads import intra_op_threads, lanes, run_in_lanes
from model_registry.errors import ModelUnavailable

log = logging.getLogger(__name__)

#: Quantized variants of `onnx/model.onnx` as hubs publish them: sentence-transformers' exports
#: per instruction set (`model_qint8_avx512_vnni.onnx`, ...), then the generic names.
_OWN_INT8_FOR = {
    "avx512_vnni": ("model_qint8_avx512_vnni.onnx", "model_qint8_avx512.onnx"),
    "avx512f": ("model_qint8_avx512.onnx",),
    "avx2": ("model_quint8_avx2.onnx", "model_qint8_avx2.onnx"),
    "asimd": ("model_qint8_arm64.onnx",),
}
_OWN_INT8 = ("model_quantized.onnx", "model_int8.onnx")
#: What exporting a model that ships no graph imports (`export`, `build`), by package.
EXPORT_NEEDS = ("torch", "transformers", "onnx", "onnxscript")


def int8_names(flags: frozenset[str]) -> tuple[str, ...]:
    """The quantized files to look for on a CPU with these flags, the one made for it first: a
    variant made for an instruction set the CPU lacks would not run, or run slowly."""
    made_for = [name for flag, names in _OWN_INT8_FOR.items() if flag in flags for name in names]
    return (*dict.fromkeys(made_for), *_OWN_INT8)


def _own_names(quantize: str, fp16: bool) -> tuple[str, ...]:
    from model_registry.backends.choice import cpu_flags

    return int8_names(cpu_flags()) if quantize == "int8" else ("model_fp16.onnx",) if fp16 else ("model.onnx",)


def own_candidates(directory: Path, quantize: str, fp16: bool) -> list[Path]:
    """The directory's own ONNX files for these options, in the order they are tried, unread."""
    return [directory / "onnx" / name for name in _own_names(quantize, fp16) if (directory / "onnx" / name).is_file()]


def own_file(directory: Path, task: Task, quantize: str, fp16: bool) -> Path | None:
    """The directory's own ONNX file for these options, if it has one with the right output."""
    return next((p for p in own_candidates(directory, quantize, fp16) if _has_output(p, OUTPUT[task])), None)


def own_names(quantize: str, fp16: bool) -> str:
    """The files `own_file` looks for, as a message names them."""
    return " or ".join(f"onnx/{name}" for name in _own_names(quantize, fp16))


def _has_output(path: Path, output: str) -> bool:
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception:
        log.warning("the ONNX file %s cannot be read; exporting the model instead", path)
        return False
    return output in {o.name for o in session.get_outputs()}


def _check_export(directory: Path, options: EngineOptions, fp16: bool) -> None:
    """A model without its own graph for these options is exported (`build`), which needs torch,
    transformers and onnx: where one is missing, say which file would have served and which extra
    exports it."""
    absent = [name for name in EXPORT_NEEDS if importlib.util.find_spec(name) is None]
    if absent:
        raise ModelUnavailable(
            f"{directory} ships no {own_names(options.quantize, fp16)}, and exporting one needs "
            f"{', '.join(absent)}: pip install 'infinity-server[onnx-export]'"
        )


class CudaProviderFailed(ModelUnavailable):
    """The CUDA provider was asked for and onnxruntime ran the session on the CPU instead."""


_preload_lock = threading.Lock()
_preloaded = False


def _preload_cuda_libraries() -> None:
    """Load the CUDA and cuDNN libraries of the `nvidia-*` wheels (or torch's, when torch is
    imported) before the first CUDA session, as onnxruntime-gpu documents: its CUDA provider finds
    them only on the loader's path otherwise. Once per process, and a model loading on another
    thread meanwhile waits for it; where the function is missing (onnxruntime < 1.21), the
    loader's path is all there is."""
    global _preloaded
    with _preload_lock:
        if _preloaded:
            return
        _preloaded = True
        preload = getattr(ort, "preload_dlls", None)
        if preload is None:
            return
        try:
            preload()
        except Exception as error:  # a library it could not find: the session's check says what is missing
            log.warning("onnxruntime could not preload the CUDA libraries: %s", error)


def cuda_devices() -> int:
    """CUDA devices the driver sees (0 without a driver): onnxruntime cannot say, because its CUDA
    build lists its provider on a machine without a GPU too, and torch is not this engine's to ask."""
    try:
        driver = ctypes.CDLL("libcuda.so.1" if sys.platform != "win32" else "nvcuda.dll")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def resolve_device(requested: str) -> str:
    cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    if requested == "auto":
        return "cuda:0" if cuda and cuda_devices() > 0 else "cpu"
    if requested.startswith("cuda") and not cuda:
        raise ModelUnavailable(
            f"device '{requested}' needs onnxruntime's CUDA provider; pip install 'infinity-server[onnx-gpu]'"
        )
    if requested not in ("cpu",) and not requested.startswith("cuda"):
        raise ModelUnavailable(f"the onnx backend runs on cpu or cuda, not '{requested}'")
    return requested if ":" in requested or requested == "cpu" else "cuda:0"


class OnnxEngine(Engine):
    name = "onnx"

    def __init__(self) -> None:
        self.session: ort.InferenceSession | None = None
        self.path: Path | None = None
        self.own = False
        self.inputs: frozenset[str] = frozenset()
        self.output = "last_hidden_state"
        self.task: Task = "feature-extraction"
        self._bytes = 0
        self.lanes = 1
        self.fp16 = False
        #: What `build` found or exported, for the `load` with the same arguments.
        self._built: tuple[tuple[Path, EngineOptions], Path, bool] | None = None

    def build(self, directory: Path, options: EngineOptions) -> None:
        """The export into the cache, unless the directory has its own ONNX file for these options."""
        self._source(directory, options)

    def load(self, directory: Path, options: EngineOptions) -> None:
        self.path, self.own = self._source(directory, options)
        self._built = None
        before = psutil.Process().memory_info().rss  # after any export: only what loading adds
        self.session = self._session(self.path, options) if self.own else self._cached_session(directory, options)
        grown = psutil.Process().memory_info().rss - before
        self._bytes = max(grown, self.path.stat().st_size)
        self.inputs = frozenset(i.name for i in self.session.get_inputs())

    def _settle(self, options: EngineOptions) -> None:
        """Device, lanes, precision and output for `options`; a combination that cannot run raises."""
        self.device = resolve_device(options.device)
        cuda = self.device.startswith("cuda")
        # On CPU a batch of several rows runs in lanes (see `threads`); on CUDA in one run.
        self.lanes = 1 if cuda else lanes(options.lanes)
        if options.dtype == "float16" and not cuda:
            raise ModelUnavailable("dtype float16 on the onnx backend needs a CUDA device; use float32 on CPU")
        self.fp16 = cuda and options.dtype in ("auto", "float16") and options.quantize == "none"
        if options.quantize == "int8" and cuda:
            raise ModelUnavailable("quantize: int8 on the onnx backend is CPU only; use dtype float16 on CUDA")
        self.dtype = "int8" if options.quantize == "int8" else "float16" if self.fp16 else "float32"
        self.task, self.output = options.task, OUTPUT[options.task]

    def _source(self, directory: Path, options: EngineOptions) -> tuple[Path, bool]:
        """The ONNX file to load and whether it is the directory's own, else the cached export."""
        if self._built is not None and self._built[0] == (directory, options):
            return self._built[1], self._built[2]
        self._settle(options)
        own = own_file(directory, options.task, options.quantize, self.fp16)
        if own is None:
            _check_export(directory, options, self.fp16)
        path = own if own is not None else artifact_for(directory, options, self.fp16) / "model.onnx"
        self._built = ((directory, options), path, own is not None)
        return path, own is not None

    def _cached_session(self, directory: Path, options: EngineOptions) -> ort.InferenceSession:
        """A session on the cached export; one that onnxruntime refuses is rebuilt once."""
        assert self.path is not None
        try:
            return self._session(self.path, options)
        except CudaProviderFailed:
            raise  # the artifact is fine; the device's libraries are not
        except Exception as error:
            log.warning("the cached ONNX model %s failed to load (%s); rebuilding it", self.path, error)
        invalidate(self.path.parent)
        self.path = artifact_for(directory, options, self.fp16) / "model.onnx"
        try:
            return self._session(self.path, options)
        except CudaProviderFailed:
            raise
        except Exception as error:
            raise load_failed("onnx", self.path.parent, error) from error

    def _session(self, path: Path, options: EngineOptions) -> ort.InferenceSession:
        settings = ort.SessionOptions()
        settings.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        cuda = self.device.startswith("cuda")
        # On CPU the lanes call this session at once: they share its weights and this pool.
        settings.intra_op_num_threads = intra_op_threads(options.threads)
        settings.inter_op_num_threads = 1
        settings.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        settings.log_severity_level = 3
        # Idle pool threads sleep instead of spinning: in a server the cores are shared with the
        # tokenizing threads and the event loop, which spinning threads starve (measured with the
        # bundled MiniLM over HTTP: single-sentence p50 14-18 ms without spinning, 17-26 ms with it).
        settings.add_session_config_entry("session.intra_op.allow_spinning", "0")
        settings.add_session_config_entry("session.inter_op.allow_spinning", "0")
        if not cuda:
            return ort.InferenceSession(str(path), settings, providers=["CPUExecutionProvider"])
        _preload_cuda_libraries()
        index = int(self.device.partition(":")[2] or 0)
        providers = [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
        session = ort.InferenceSession(str(path), settings, providers=providers)
        if "CUDAExecutionProvider" not in session.get_providers():
            # onnxruntime falls back to the CPU when its CUDA provider cannot start (a missing
            # CUDA or cuDNN library): a model asked to run on the GPU must not run on the CPU unseen.
            raise CudaProviderFailed(
                f"onnxruntime could not start its CUDA provider on {self.device} (its CUDA and cuDNN "
                "libraries were not found); pip install 'onnxruntime-gpu[cuda,cudnn]' or put them on "
                "LD_LIBRARY_PATH, or run this model on device: cpu"
            )
        return session

    def run(self, batch: EncoderBatch) -> EncoderOutput:
        assert self.session is not None, "This is a bug: run() called before load()"
        feeds = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
        if "token_type_ids" in self.inputs:
            types = batch.token_type_ids
            feeds["token_type_ids"] = types if types is not None else np.zeros_like(batch.input_ids)
        if TASK_INPUT in self.inputs:
            assert batch.task_id is not None, "This is a bug: a batch without its task on a graph that takes one"
            feeds[TASK_INPUT] = np.asarray(batch.task_id, dtype=np.int64)
        with compute_slot(self.device):
            if self.device.startswith("cuda"):
                value: Any = self._cuda_run(feeds)
            else:
                value = run_in_lanes(self._cpu_run(feeds), batch.input_ids.shape[0], self.lanes)
        if self.output == "last_hidden_state":
            return EncoderOutput(hidden=value)
        return EncoderOutput(logits=value)

    def _cpu_run(self, feeds: dict[str, np.ndarray]) -> Callable[[slice], np.ndarray]:
        """A lane's work: the session on its rows of `feeds`."""
        session = self.session
        assert session is not None

        def run(rows: slice) -> np.ndarray:
            part = {name: value[rows] if value.ndim else value for name, value in feeds.items()}
            return np.asarray(session.run([self.output], part)[0], dtype=np.float32)

        return run

    def _cuda_run(self, feeds: dict[str, np.ndarray]) -> ort.OrtValue:
        """IO binding: inputs copied once to the device, the output allocated there by ONNX Runtime
        and left there, as an `OrtValue` that torch takes by DLPack without a copy: the adapter
        pools on the device and only the pooled rows come back to the host. (A batch's hidden
        state copied back would be 25 MB for 16,384 tokens of MiniLM, a SPLADE batch's vocabulary
        logits gigabytes.) The run has finished with the output when it returns: the CUDA provider
        synchronizes its stream at the end of each run."""
        assert self.session is not None
        binding = self.session.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
        binding.bind_output(self.output, "cuda", int(self.device.partition(":")[2] or 0))
        self.session.run_with_iobinding(binding)
        output: ort.OrtValue = binding.get_outputs()[0]
        return output

    def footprint(self) -> int:
        return self._bytes if self.session is not None else 0

    def release(self) -> None:
        self.session = None

    def _shown_path(self) -> str | None:
        """The file as `onnx/<key>/model.onnx` (the engine cache) or `<model>/onnx/model.onnx` (the
        model's own): where the server keeps either is for its log, not for clients."""
        return None if self.path is None else str(Path(*self.path.parts[-3:]))

    def describe(self) -> dict[str, Any]:
        providers = self.session.get_providers() if self.session is not None else []
        return {
            "artifact": self._shown_path(),
            "own_file": self.own,
            "providers": providers,
            "precision": self.dtype,
            "lanes": self.lanes,
        }
