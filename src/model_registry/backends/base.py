"""The engine contract: one transformer forward pass, whatever runs it.

An engine is what an adapter's `forward` calls. It loads one model directory with device, dtype
and quantization options, runs a padded batch of token ids and returns the outputs the adapter
needs; tokenizing, pooling, normalising and every head the engine does not carry (SPLADE's
log-saturation, ColBERT's projection, BGE-M3's heads, classifier heads on CTranslate2) stay in the
adapter, written once for all engines.

This module is a leaf: it imports only the standard library and numpy, so that every engine
(torch, ONNX Runtime, CTranslate2) depends on it alone and adapters depend on engines, never the
reverse.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

#: What the forward pass returns: the encoder's last hidden state, a sequence classifier's logits,
#: a masked-LM's vocabulary logits, or a causal LM's logits of a few vocabulary rows (`rows`) at
#: each sequence's last real token.
Task = Literal["feature-extraction", "sequence-classification", "masked-lm", "causal-lm"]
#: Where `auto`'s measured standing applies: (host, precision), as `choice.host_kind` and
#: `choice.precision_of` name them: ("cpu/avx2", "fp32"), ("cuda", "float16"), ("cpu", "int8"), ...
Where = tuple[str, str]


@dataclass(frozen=True)
class EngineFacts:
    """What an engine is, declared by its package (`backends/<name>/__init__.py`) without importing
    it: the support matrix, the start-up checks and `auto`'s choice are read from these."""

    name: str
    #: As the docs name it ("ONNX Runtime").
    title: str
    #: "module:Class" of its `Engine`, imported when a model loads on it.
    implementation: str
    #: The project's extra that installs it, and the module whose presence says it is installed.
    extra: str
    probe: str
    dtypes: frozenset[str]
    quantize: frozenset[str] = frozenset({"none"})
    #: The kinds it serves (None: every kind).
    kinds: frozenset[str] | None = None
    #: The `model_type`s it runs (None: every one, by the model's own code).
    architectures: frozenset[str] | None = None
    #: Architectures it runs as some kinds only, as far as the parity tests cover them.
    only: dict[str, frozenset[str]] = field(default_factory=dict)
    #: Architectures it cannot run on CUDA, and why.
    not_on_cuda: dict[str, str] = field(default_factory=dict)
    #: Converts a model by its `model_type` into its own implementation, so a checkpoint run by code
    #: of its own (`auto_map`) would lose that code.
    converts: bool = False
    #: On CUDA, the distribution and extra it needs instead of `extra`'s (a GPU build), if any.
    cuda_build: tuple[str, str] | None = None
    #: Its measured standing for `auto`: per (host, precision), its place among the engines tried
    #: (1 first); None where it was measured and is not tried. Torch, which serves every model,
    #: comes after them all and declares none.
    fastest: dict[Where, int | None] = field(default_factory=dict)
    #: Architectures measured on their own: per (host, precision), its place or None, in place of
    #: `fastest`'s rows; a host or precision not measured for the architecture runs it on torch.
    fastest_for: dict[str, dict[Where, int | None]] = field(default_factory=dict)


#: The input of a graph that selects the batch's task adapter (`EncoderBatch.task_id`), and the
#: file of a model's directory that holds the adapters' factors (`lora.py`).
TASK_INPUT = "task_id"
LORA_FILE = "lora.safetensors"


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """How to load: `device` and `dtype` as configured ('auto' allowed), `quantize` none|int8|fp8,
    `threads` for the intra-op pool (None: every core), `lanes` for the CPU batches of ONNX Runtime
    and CTranslate2 (None: two where there are two cores or more; see `threads.lanes`),
    `cache_dir` for converted artifacts."""

    task: Task = "feature-extraction"
    device: str = "auto"
    dtype: str = "auto"
    quantize: str = "none"
    threads: int | None = None
    lanes: int | None = None
    cache_dir: str | None = None
    trust_remote_code: bool = False
    #: The vocabulary rows whose logits the causal-lm task returns (an LLM reranker's two tokens).
    rows: tuple[int, ...] = ()
    #: The torch engine's CUDA graphs for small batches: "auto" (where safe), True, False.
    cuda_graphs: bool | Literal["auto"] = "auto"


@dataclass(frozen=True)
class EncoderBatch:
    """A padded batch: (batch, tokens) int64 arrays; `token_type_ids` only where the model has them.

    `output_mask` (batch, tokens), where given, marks the positions whose outputs the adapter reads
    when they reach beyond the attention mask: ColBERT's query expansion tokens, which the
    attention does not see but which each yield a vector. None: the attention mask's positions.
    `task_id`, where the model's graph takes one, selects its task adapter (`backends/torch/lora.py`)."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray | None = None
    output_mask: np.ndarray | None = None
    task_id: int | None = None


@dataclass(frozen=True)
class Packed:
    """Where each sequence of a padding-free batch lies in its packed outputs.

    `keep` (batch, tokens) bool, on the host: the positions of the padded batch that were packed
    (the output mask's, else the attention mask's), taken row by row in order, so that
    `padded[keep]` gives any (batch, tokens) tensor's values in the packed order; `cu_seqlens`
    (batch + 1,) int32: row i's tokens are [cu_seqlens[i], cu_seqlens[i + 1]); `segments`
    (packed tokens,) int64: the row of each token. The last two are on the engine's device."""

    keep: Any
    cu_seqlens: Any
    segments: Any


@dataclass(frozen=True)
class EncoderOutput:
    """`hidden`: (batch, tokens, hidden) last hidden state; `logits`: (batch, labels) or
    (batch, tokens, vocab) for the task's head when the engine carries it, else None.

    With `packed` (an engine that ran the batch padding-free), the per-token outputs hold the real
    tokens alone, concatenated: `hidden` is (packed tokens, hidden) and per-token `logits`
    (packed tokens, vocab), laid out as `packed` says; per-row logits stay (batch, labels).

    On CPU they are numpy arrays. On CUDA they stay on the device, in the engine's own type: a torch
    tensor (torch), an `OrtValue` (ONNX Runtime, DLPack) or a `StorageView` (CTranslate2, the CUDA
    array interface), so that the adapter's heads run there and only their results come back to
    the host; `adapters.dense.as_tensor` takes each of them without a copy."""

    hidden: Any = None
    logits: Any = None
    packed: Packed | None = None


class Engine(abc.ABC):
    """One loaded transformer. Synchronous; one `run` at a time per engine (the worker's forward)."""

    name: ClassVar[str]
    #: The device and dtype actually used, after 'auto' was resolved.
    device: str = "cpu"
    dtype: str = "float32"

    def build(self, directory: Path, options: EngineOptions) -> None:
        """Make what `load` reads, without touching the device: an export or a conversion into the
        artifact cache (none by default). Called before `load` with the same arguments, outside the
        device's gate; `load` builds whatever this did not."""
        return None

    @abc.abstractmethod
    def load(self, directory: Path, options: EngineOptions) -> None:
        """Read the model in `directory` (converting it first, once, if `build` did not)."""

    @abc.abstractmethod
    def run(self, batch: EncoderBatch) -> EncoderOutput:
        """The forward pass on one padded batch; rows are independent of each other."""

    @abc.abstractmethod
    def footprint(self) -> int:
        """Bytes the loaded weights hold (measured, not read from the file sizes)."""

    @abc.abstractmethod
    def release(self) -> None:
        """Drop every reference to the weights and sessions so that memory can come back."""

    def carries_head(self, task: Task) -> bool:
        """Whether `run` returns `logits` for `task` (else the adapter applies its own head)."""
        return True

    def describe(self) -> dict[str, Any]:
        """Facts for `/models`: artifact, providers, compute type..."""
        return {}
