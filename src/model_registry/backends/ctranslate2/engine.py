"""The CTranslate2 engine: BERT-family encoders converted once into the engine cache.

CTranslate2 returns the encoder's last hidden state (and BERT's pooler output); pooling and every
head, classifier heads included, run in the adapter. Compute types: float32 and int8 on CPU,
float16 and int8_float16 on CUDA (dtype `int8_float16`, or `float16` with `quantize: int8`).
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import ctranslate2
import numpy as np
import psutil

from model_registry.backends import build_process
from model_registry.backends.base import EncoderBatch, EncoderOutput, Engine, EngineOptions, Task
from model_registry.backends.cache import artifact_key, cached, invalidate, load_failed, writable_root
from model_registry.backends.devices import compute_slot
from model_registry.backends.threads import intra_op_threads, lanes, run_in_lanes
from model_registry.backends.weights import from_pretrained_checked
from model_registry.errors import ModelUnavailable

log = logging.getLogger(__name__)

RECIPE = "ct2-transformers-converter:1"


def compute_type(device: str, dtype: str, quantize: str) -> str:
    """The CTranslate2 compute type for the configured dtype and quantization on `device`."""
    cuda = device == "cuda"
    if dtype == "int8_float16" or (cuda and quantize == "int8"):
        if not cuda:
            raise ModelUnavailable("compute type int8_float16 needs a CUDA device; use quantize: int8 on CPU")
        return "int8_float16"
    if quantize == "int8":
        return "int8"
    if dtype == "float16" or (dtype == "auto" and cuda):
        if not cuda:
            raise ModelUnavailable("dtype float16 on the ctranslate2 backend needs a CUDA device")
        return "float16"
    return "float32"


class _CheckedConverter(ctranslate2.converters.TransformersConverter):  # type: ignore[misc]
    """The converter, refusing a checkpoint that lacks weights `task` reads."""

    def __init__(self, source: str, task: Task, **kwargs: Any) -> None:
        super().__init__(source, **kwargs)
        self.task = task

    def load_model(self, model_class: Any, model_name_or_path: str, **kwargs: Any) -> Any:
        # The converter stores the encoder alone; it loads XLM-R as a sequence classifier, whose head
        # an embedder lacks, but never reads that head (a reranker's runs in the adapter, checked there).
        # It loads RoBERTa and CamemBERT with a pooler, which their classifiers do not ship: their head
        # reads the first token's state (the adapter's), never the pooler.
        unread = (
            ("classifier.", "pooler.") if _classifier_without_pooler(Path(model_name_or_path)) else ("classifier.",)
        )
        return from_pretrained_checked(model_class, Path(model_name_or_path), self.task, unread=unread, **kwargs)


#: Architectures whose sequence classifiers' head reads the first token's state, not a pooler.
_POOLERLESS_HEADS = frozenset({"roberta", "xlm-roberta", "camembert"})


def _classifier_without_pooler(directory: Path) -> bool:
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    architectures = [str(a) for a in config.get("architectures") or ()]
    classifier = any(a.endswith("ForSequenceClassification") for a in architectures)
    return classifier and config.get("model_type") in _POOLERLESS_HEADS


def convert(directory: Path, staging: Path, trust_remote_code: bool, task: Task) -> None:
    """`convert_here` in a child process (see `build_process`)."""
    build_process.run(
        f"{__name__}:convert_here",
        directory=str(directory),
        staging=str(staging),
        trust_remote_code=trust_remote_code,
        task=task,
    )


def convert_here(directory: str, staging: str, trust_remote_code: bool, task: Task) -> None:
    """CTranslate2's own converter; weights are stored in float32 and quantized at load time."""
    log.info("converting %s to CTranslate2 (once; later loads read the cache)", directory)
    source = _with_converter_defaults(Path(directory), Path(staging) / "source")
    try:
        converter = _CheckedConverter(str(source), task, trust_remote_code=trust_remote_code)
        converter.convert(str(Path(staging) / "model"), force=True)
    finally:
        shutil.rmtree(source, ignore_errors=True)


def _with_converter_defaults(directory: Path, view: Path) -> Path:
    """A view of `directory` (links to its files) whose config.json has the keys the converter
    reads but transformers 5 does not write (`position_embedding_type`, absolute by default)."""
    view.mkdir()
    for path in directory.iterdir():
        if path.name != "config.json":
            (view / path.name).symlink_to(path.resolve())
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    config.setdefault("position_embedding_type", "absolute")
    (view / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return view


def replica_threads(threads: int, lanes: int, compute: str) -> int:
    """Each replica's threads: the cores shared out between the lanes, never more than the cores.

    A float replica keeps two at least where there are two: a long document runs faster on two
    threads each than on one. An int8 replica takes its share even when that is one: it is as
    fast on a long document and faster in bulk and idle. From 4 cores up both rules give the same
    (figures: docs/history/backends-tuning.md)."""
    floor = 1 if compute.startswith("int8") else 2
    return max(1, min(threads, max(floor, threads // lanes)))


class Ct2Engine(Engine):
    name = "ctranslate2"

    def __init__(self) -> None:
        self.encoder: Any = None
        self.path: Path | None = None
        self.task: Task = "feature-extraction"
        self._bytes = 0
        self.lanes = 1
        self.lane_threads = 0
        #: What `build` converted, for the `load` with the same arguments.
        self._built: tuple[tuple[Path, EngineOptions], Path] | None = None

    def build(self, directory: Path, options: EngineOptions) -> None:
        """The conversion into the cache."""
        self._artifact(directory, options)

    def load(self, directory: Path, options: EngineOptions) -> None:
        artifact = self._artifact(directory, options)
        self._built = None
        self.path = artifact / "model"
        device, index = self.device.partition(":")[0], int(self.device.partition(":")[2] or 0)
        before = psutil.Process().memory_info().rss  # after the conversion: only what loading adds
        try:
            self.encoder = self._open(device, index, options)
        except (RuntimeError, ValueError) as error:
            log.warning("the cached CTranslate2 model %s failed to load (%s); rebuilding it", self.path, error)
            invalidate(artifact)
            self.path = self._convert(directory, options) / "model"
            try:
                self.encoder = self._open(device, index, options)
            except (RuntimeError, ValueError) as again:
                raise load_failed("ctranslate2", self.path.parent, again) from again
        weights = sum(p.stat().st_size for p in self.path.iterdir() if p.is_file())
        self._bytes = max(
            psutil.Process().memory_info().rss - before, weights // 4 if self.dtype.startswith("int8") else weights
        )

    def _settle(self, options: EngineOptions) -> None:
        """Device, lanes and compute type for `options`; a combination that cannot run raises."""
        cuda_count = ctranslate2.get_cuda_device_count()
        requested = options.device
        device = "cuda" if requested.startswith("cuda") or (requested == "auto" and cuda_count) else "cpu"
        if device == "cuda" and not cuda_count:
            raise ModelUnavailable(f"device '{requested}' was asked for, but CTranslate2 sees no CUDA device")
        index = int(requested.partition(":")[2] or 0) if device == "cuda" else 0
        self.device = f"cuda:{index}" if device == "cuda" else "cpu"
        # On CPU a batch of several rows runs in lanes, a replica each over shared weights (see
        # `threads`); on CUDA in one run.
        self.lanes = 1 if device == "cuda" else lanes(options.lanes)
        self.dtype = compute_type(device, options.dtype, options.quantize)
        self.task = options.task

    def _artifact(self, directory: Path, options: EngineOptions) -> Path:
        if self._built is not None and self._built[0] == (directory, options):
            return self._built[1]
        self._settle(options)
        artifact = self._convert(directory, options)
        self._built = ((directory, options), artifact)
        return artifact

    def _convert(self, directory: Path, options: EngineOptions) -> Path:
        """The cached conversion of `directory`, converted now if it is missing or corrupt."""
        versions = {"ctranslate2": ctranslate2.__version__, "transformers": importlib.metadata.version("transformers")}
        key = artifact_key(directory, versions, {"recipe": RECIPE})

        def build(staging: Path) -> None:
            convert(directory, staging, options.trust_remote_code, options.task)

        root = writable_root(options.cache_dir)
        return cached(root, "ctranslate2", key, build, meta={"source": str(directory), **versions})

    def _open(self, device: str, index: int, options: EngineOptions) -> Any:
        self.lane_threads = replica_threads(intra_op_threads(options.threads), self.lanes, self.dtype)
        return ctranslate2.Encoder(
            str(self.path),
            device=device,
            device_index=index,
            compute_type=self.dtype,
            intra_threads=self.lane_threads,
            inter_threads=self.lanes,
        )

    def carries_head(self, task: Task) -> bool:
        return task == "feature-extraction"

    def run(self, batch: EncoderBatch) -> EncoderOutput:
        assert self.encoder is not None, "This is a bug: run() called before load()"
        mask = batch.attention_mask
        if mask.shape[1] and not bool(mask[:, 0].all()):
            raise ModelUnavailable("the ctranslate2 backend needs right-padded batches; this tokenizer pads left")
        ids = np.ascontiguousarray(batch.input_ids, dtype=np.int32)
        lengths = mask.sum(axis=1).astype(np.int32)
        types = None if batch.token_type_ids is None else np.ascontiguousarray(batch.token_type_ids, dtype=np.int32)
        encoder = self.encoder

        def forward(rows: slice) -> Any:
            # CTranslate2 takes segment ids as nested lists only (a StorageView is a TypeError).
            # Segment ids go in as nested lists: the binding takes no StorageView for them.
            part_types = None if types is None else types[rows].tolist()
            output = encoder.forward_batch(
                ctranslate2.StorageView.from_array(ids[rows]),
                ctranslate2.StorageView.from_array(lengths[rows]),
                token_type_ids=part_types,
            )
            return output.last_hidden_state

        with compute_slot(self.device):
            if self.device != "cpu":
                # The state stays on the device, a `StorageView` that torch takes through the CUDA
                # array interface without a copy: the adapter pools it there. The encoder has
                # synchronized its stream before returning it.
                return EncoderOutput(hidden=forward(slice(0, ids.shape[0])))

            def on_host(rows: slice) -> np.ndarray:
                return np.asarray(forward(rows), dtype=np.float32)

            return EncoderOutput(hidden=run_in_lanes(on_host, ids.shape[0], self.lanes))

    def footprint(self) -> int:
        return self._bytes if self.encoder is not None else 0

    def release(self) -> None:
        if self.encoder is not None:
            self.encoder.unload_model()
        self.encoder = None

    def describe(self) -> dict[str, Any]:
        return {
            # `ctranslate2/<key>/model`: where the server keeps the cache is for its log, not for clients.
            "artifact": None if self.path is None else str(Path(*self.path.parts[-3:])),
            "compute_type": self.dtype,
            "precision": self.dtype,
            "lanes": self.lanes,
            "lane_threads": self.lane_threads,
        }
