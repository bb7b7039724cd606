"""The torch backend: device and dtype choice, CPU threads, sizes, releasing memory.

torch is imported here and in adapters that run on it, never by `import model_registry`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading
from pathlib import Path
from typing import Any

import torch

from model_registry.backends.base import EncoderBatch, EncoderOutput, Engine, EngineOptions, Task
from model_registry.backends.devices import compute_slot
from model_registry.backends.threads import cores
from model_registry.backends.torch import fp8, graphs, packed
from model_registry.backends.weights import activation_bytes, from_pretrained_checked
from model_registry.errors import ModelUnavailable

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_threads_lock = threading.Lock()
_threads_set = False


def resolve_device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ModelUnavailable(f"device '{requested}' was asked for, but CUDA is not available on this machine")
    return requested


#: Families whose activations overflow float16 (EmbeddingGemma's model card: float32 or bfloat16
#: only): `auto` runs them in bfloat16 on CUDA, or float32 where the GPU has no bfloat16.
NO_FLOAT16 = frozenset({"gemma3", "gemma3_text"})


def resolve_dtype(requested: str, device: str, model_type: str | None = None) -> torch.dtype:
    """'auto' is float16 on CUDA (bfloat16 for `NO_FLOAT16` families) and float32 elsewhere
    (half precision is slow on CPUs)."""
    if requested == "auto":
        if not device.startswith("cuda"):
            return torch.float32
        if model_type not in NO_FLOAT16:
            return torch.float16
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    if requested not in _DTYPES:
        raise ModelUnavailable(f"dtype '{requested}' is not supported by the torch backend; use {sorted(_DTYPES)}")
    return _DTYPES[requested]


def configure_threads(threads: int | None) -> None:
    """Set torch's intra-op threads once per process: every core, one inter-op thread.

    Models share the cores; a second model asking for a different count does not change it.
    """
    global _threads_set
    with _threads_lock:
        if _threads_set:
            return
        torch.set_num_threads(max(1, threads or cores()))
        # Already set, or parallel work already started: keep torch's choice.
        with contextlib.suppress(RuntimeError):
            torch.set_num_interop_threads(1)
        _threads_set = True


def confine(count: int) -> int | None:
    """Let torch's operators on the calling thread use at most `count` threads, leaving every
    other thread's count as it is; the calling thread's count before, or None where that cannot be
    done (torch not on OpenMP). `confine(before)` puts it back.

    For the forward thread of a model whose engine is not torch and whose head is small (pooling,
    a normalisation, a classifier's linear layers): each of torch's parallel operators there
    leaves the pool's other threads spinning for milliseconds afterwards, on the cores the
    engine's own threads are using. `torch.set_num_threads` cannot do this: it also sets the count
    that every thread using torch for the first time afterwards starts with. A thread's OpenMP
    count (`nthreads-var`) is its own, and torch reads it for each operator, so it is set in the
    OpenMP runtime torch itself loaded."""
    before = torch.get_num_threads()  # first: torch sets a thread's count up on its first use
    runtime = _openmp()
    if runtime is None:
        return None
    runtime.omp_set_num_threads(max(1, count))
    return before


@functools.cache
def _openmp() -> ctypes.CDLL | None:
    """The OpenMP runtime torch loaded (its wheels carry their own), found among the libraries
    this process has mapped: never a second copy. None where torch does not run on OpenMP."""
    if "OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if ".so" in line}
    except OSError:
        return None
    home = str(Path(torch.__file__).resolve().parent)  # the maps list real paths, past any symlink
    for path in sorted(p for p in paths if p.startswith(home) and "omp" in Path(p).name):
        try:
            return ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)  # only if already loaded
        except OSError:
            continue
    return None


def module_bytes(module: torch.nn.Module) -> int:
    tensors = [*module.parameters(), *module.buffers()]
    return sum(tensor_bytes(t) for t in tensors)


def tensor_bytes(tensor: torch.Tensor) -> int:
    """The bytes a tensor holds. A tensor subclass counts the tensors inside it: torchao's float8
    weight reports the dtype it stands for, while it holds 8-bit data and float32 scales."""
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is None:
        return tensor.numel() * tensor.element_size()
    names, _ = flatten()
    return sum(tensor_bytes(getattr(tensor, name)) for name in names)


def activation_estimate(config: Any, max_batch_tokens: int, max_length: int | None, dtype: torch.dtype) -> int:
    """`weights.activation_bytes` in `dtype`."""
    return activation_bytes(config, max_batch_tokens, max_length, torch.finfo(dtype).bits // 8)


_AUTO_CLASSES = {
    "feature-extraction": "AutoModel",
    "sequence-classification": "AutoModelForSequenceClassification",
    "masked-lm": "AutoModelForMaskedLM",
    "causal-lm": "AutoModelForCausalLM",
}


def _auto_class(task: Task, config: Any) -> str:
    """The transformers class that loads a model for `task`. An encoder-decoder's embedder (T5,
    sentence-t5, GTR) is its encoder alone (`T5EncoderModel`), which `AutoModel` would load with a
    decoder its files lack; transformers' text-encoding table names those encoder classes."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES as ENCODERS

    if task == "feature-extraction" and "EncoderModel" in ENCODERS.get(getattr(config, "model_type", ""), ""):
        return "AutoModelForTextEncoding"
    return _AUTO_CLASSES[task]


def keep_rows(model: Any, rows: tuple[int, ...]) -> None:
    """Replace a causal LM's head by its `rows` alone, so that a forward computes those logits and
    not the whole vocabulary's (and an untied head's memory comes back)."""
    head = model.get_output_embeddings()
    if not rows or head is None:
        raise ModelUnavailable("This is a bug: a causal LM loaded without the vocabulary rows it scores")
    index = torch.tensor(rows)
    small = torch.nn.Linear(head.in_features, len(rows), bias=head.bias is not None, dtype=head.weight.dtype)
    with torch.no_grad():
        small.weight.copy_(head.weight[index])
        if head.bias is not None:
            small.bias.copy_(head.bias[index])
    model.config.tie_word_embeddings = False  # the small head is its own, never re-tied to the embeddings
    model.set_output_embeddings(small)


class TorchEngine(Engine):
    """Eager transformers on torch: the reference every other engine is checked against.

    It carries every head transformers has, including decoder rerankers, which it scores on the
    last real token found from the attention mask (so neither a missing pad token nor one equal to
    end-of-text changes the result)."""

    name = "torch"

    def __init__(self) -> None:
        self.model: Any = None
        self.config: Any = None
        self.task: Task = "feature-extraction"
        self.torch_dtype = torch.float32
        self.decoder = False
        self.kernel: packed.Kernel | None = None
        self.attention_reason = ""
        self.precision = ""
        self.graphs: graphs.Graphs | None = None
        self.graphs_reason = ""

    def load(self, directory: Path, options: EngineOptions) -> None:
        import transformers
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        if options.quantize not in ("none", "fp8"):
            raise ModelUnavailable(
                f"the torch engine does not quantize (quantize: {options.quantize}); "
                "use backend: onnx or backend: ctranslate2 for int8"
            )
        self.device = resolve_device(options.device)
        config = transformers.AutoConfig.from_pretrained(str(directory), trust_remote_code=options.trust_remote_code)
        model_type = config.model_type
        fp8_dtype = fp8.ready(options.dtype, self.device) if options.quantize == "fp8" else None
        self.torch_dtype = fp8_dtype or resolve_dtype(options.dtype, self.device, model_type)
        self.dtype = str(self.torch_dtype).removeprefix("torch.")
        configure_threads(options.threads)
        self.task = options.task
        auto_class = getattr(transformers, _auto_class(options.task, config))
        model = from_pretrained_checked(
            auto_class, directory, options.task, dtype=self.torch_dtype, trust_remote_code=options.trust_remote_code
        )
        if options.task == "causal-lm":
            keep_rows(model, options.rows)
        self.model = model.to(self.device).eval()
        if fp8_dtype is not None:
            self.precision = fp8.convert(self.model)
        self.config = self.model.config
        self.decoder = not hasattr(self.model, "classifier") and hasattr(self.model, "score")
        kernel, self.attention_reason = packed.choose(
            self.config, self.device, self.torch_dtype, self.task, self.decoder
        )
        if kernel is not None:
            self.use_padding_free(kernel, self.attention_reason)
        self.graphs, self.graphs_reason = graphs.load(options, self._padded, self.config, self.device)

    def use_padding_free(self, kernel: packed.Kernel, reason: str) -> None:
        """Run this model's batches padding-free on `kernel` ('sdpa' computes the same attention as
        'varlen' where that kernel is missing: a CPU, where the tests check the packing)."""
        packed.switch(self.model)
        self.kernel, self.attention_reason = kernel, reason

    def run(self, batch: EncoderBatch) -> EncoderOutput:
        replayed = self.graphs.run(batch) if self.graphs is not None else None
        if replayed is not None:
            return replayed
        if self.kernel is not None:
            return self._run_packed(batch, self.kernel)
        ids = torch.from_numpy(batch.input_ids).to(self.device)
        mask = torch.from_numpy(batch.attention_mask).to(self.device)
        extra = {}
        if batch.token_type_ids is not None:
            extra["token_type_ids"] = torch.from_numpy(batch.token_type_ids).to(self.device)
        with compute_slot(self.device), torch.inference_mode():
            return self._padded(ids, mask, extra)

    def _padded(self, ids: torch.Tensor, mask: torch.Tensor, extra: dict[str, torch.Tensor]) -> EncoderOutput:
        """The task's outputs for a padded batch already on the device (what CUDA graphs capture)."""
        if self.task == "feature-extraction":
            return EncoderOutput(hidden=self._forward(self.model, ids, mask, extra))
        if self.task == "sequence-classification" and self.decoder:
            return EncoderOutput(logits=self.model.score(self._last_states(ids, mask)))
        if self.task == "causal-lm":
            return EncoderOutput(logits=self.model.get_output_embeddings()(self._last_states(ids, mask)))
        if self.task == "masked-lm":
            return EncoderOutput(logits=self._forward(self.model, ids, mask, extra))
        return EncoderOutput(logits=self.model(input_ids=ids, attention_mask=mask, **extra).logits)

    def _forward(self, module: Any, ids: torch.Tensor, mask: torch.Tensor, extra: dict[str, torch.Tensor]) -> Any:
        """`module`'s first output for a padded batch: (B, L, ...)."""
        return module(input_ids=ids, attention_mask=mask, **extra)[0]

    def _run_packed(self, batch: EncoderBatch, kernel: packed.Kernel) -> EncoderOutput:
        """The forward pass on the batch's real tokens alone (see `backends.packed`), packed on the
        host so that the device never holds the padded layout; per-token outputs stay packed."""
        start = packed.position_start(self.config)
        assert start is not None, "This is a bug: a model of a family that is not packed runs padding-free"
        attention = torch.from_numpy(batch.attention_mask)
        if batch.output_mask is None:
            packing = packed.pack(attention, kernel, self.device)
        else:
            packing = packed.pack(torch.from_numpy(batch.output_mask), kernel, self.device, attended=attention)
        ids = packed.flatten(torch.from_numpy(batch.input_ids), packing).to(self.device)
        extra = {}
        if batch.token_type_ids is not None:
            extra["token_type_ids"] = packed.flatten(torch.from_numpy(batch.token_type_ids), packing).to(self.device)
        with compute_slot(self.device), torch.inference_mode():
            if self.task in ("feature-extraction", "masked-lm"):
                states = packed.forward(self.model, packing, ids, extra, start)
                if self.task == "masked-lm":
                    return EncoderOutput(logits=states, packed=packing)
                return EncoderOutput(hidden=states, packed=packing)
            if self.task == "sequence-classification" and not self.decoder:
                raise RuntimeError("This is a bug: an encoder classifier runs padding-free")
            base = getattr(self.model, self.model.base_model_prefix)
            last = packed.last(packed.forward(base, packing, ids, {}, start), packing.cu_seqlens)
            head = self.model.get_output_embeddings() if self.task == "causal-lm" else self.model.score
            return EncoderOutput(logits=head(last))

    def _last_states(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The base model's hidden state at each row's last real token, left or right padded."""
        base = getattr(self.model, self.model.base_model_prefix)
        states = self._forward(base, ids, mask, {})
        length = mask.shape[1]
        values, from_end = mask.flip(1).max(dim=1)
        last = length - 1 - torch.where(values == 0, length - 1, from_end)
        picked = states[torch.arange(states.shape[0], device=states.device), last]
        result: torch.Tensor = picked * values.unsqueeze(-1).to(picked.dtype)
        return result

    def footprint(self) -> int:
        graph_bytes = self.graphs.bytes if self.graphs is not None else 0
        return module_bytes(self.model) + graph_bytes if self.model is not None else 0

    def release(self) -> None:
        self.graphs = None
        self.model = None

    def describe(self) -> dict[str, Any]:
        return {
            "engine": "torch",
            "precision": self.precision or self.dtype,
            "decoder": self.decoder,
            "attention": "padded" if self.kernel is None else "padding_free",
            "attention_reason": self.attention_reason,
            "cuda_graphs": {
                "enabled": self.graphs is not None,
                "reason": self.graphs_reason,
                **(self.graphs.describe() if self.graphs is not None else {}),
            },
        }
