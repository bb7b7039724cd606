"""CUDA graphs of the torch engine's forward pass, for idle traffic.

An idle query's forward pass on a GPU is a few hundred small kernels launched one at a time from
Python: the launches, not the arithmetic, set its latency. At load, the engine's padded forward is
captured once per bucket (a batch size and a length, `buckets`) into CUDA graphs that share one
memory pool; a batch that fits a bucket is copied into that bucket's input buffers, padded up to it
(`padded`), and its graph is replayed: one launch. Its outputs are cut back to the batch's rows and
columns (`sliced`) and copied out of the pool before anything else replays. A batch larger than
every bucket runs eager.

Padding up to a bucket leaves every real token's result as it was: extra columns go on the right
with attention mask 0 (a real token's position never moves, and no real token attends to them,
left-padded decoders included: they are causal and their last token is found from the mask); extra
rows hold one real token each, so that no row's attention is empty, and are dropped.

Capturing and replaying is one small piece (`Capture`): `cuda_capture` on a GPU, `eager` (the
padded batch run as it is) where the tests check the padding on a CPU.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_registry.backends.base import EncoderBatch, EncoderOutput, EngineOptions
from model_registry.backends.devices import compute_slot
from model_registry.backends.torch import packed
from model_registry.errors import ModelUnavailable

log = logging.getLogger(__name__)

#: Batch sizes of idle traffic: one query, or the few that arrive together while one runs.
BATCH_SIZES = (1, 2, 4, 8)
#: Lengths of queries and short passages. Past 128 tokens a forward pass is long enough that the
#: launches no longer dominate it; so 16 graphs, the largest 1,024 tokens, bound capture time and
#: the pool (its intermediates are the largest bucket's; its outputs, 3,600 tokens' worth in all).
LENGTHS = (16, 32, 64, 128)
#: Architectures whose forward transformers writes without data-dependent Python control flow
#: (a capture keeps one branch) and that the GPU tests check against eager: BERT, RoBERTa, XLM-R
#: encoders and Qwen2/Qwen3 decoders.
FAMILIES = ("bert", "qwen2", "qwen3", "roberta", "xlm-roberta")

#: The forward pass on tensors already on the device: input ids, attention mask, and the other
#: inputs (token types) -> the task's outputs.
Compute = Callable[[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]], EncoderOutput]
#: The outputs of one bucket, computed from its input buffers.
Replay = Callable[[], EncoderOutput]
#: Turns a bucket's computation into its replay: a captured graph, or the eager call itself.
Capture = Callable[[Replay], Replay]


@dataclass(frozen=True, order=True)
class Bucket:
    rows: int
    length: int

    @property
    def tokens(self) -> int:
        return self.rows * self.length


def buckets(longest: int) -> tuple[Bucket, ...]:
    """Every batch size with every length up to `longest` (the model's positions), the lengths past
    it replaced by `longest` itself; smallest first."""
    lengths = sorted({min(length, longest) for length in LENGTHS})
    return tuple(sorted((Bucket(rows, n) for rows in BATCH_SIZES for n in lengths), key=lambda b: (b.tokens, b)))


def fit(choices: tuple[Bucket, ...], rows: int, length: int) -> Bucket | None:
    """The smallest bucket (fewest tokens) that holds `rows` x `length`, or None."""
    return next((b for b in choices if b.rows >= rows and b.length >= length), None)


def padded(batch: EncoderBatch, bucket: Bucket, pad_id: int, types: bool) -> np.ndarray:
    """(2 or 3, rows, length) int64 for `bucket`: the ids (`pad_id` in the padding), the attention
    mask and, with `types`, the token types, the batch in the top left corner. A row of padding
    alone gets one real token (its first), so that no row's attention is empty."""
    planes = np.zeros((3 if types else 2, bucket.rows, bucket.length), dtype=np.int64)
    rows, length = batch.input_ids.shape
    planes[0] = pad_id
    planes[0, :rows, :length] = batch.input_ids
    planes[1, :rows, :length] = batch.attention_mask
    planes[1, rows:, 0] = 1
    if types and batch.token_type_ids is not None:
        planes[2, :rows, :length] = batch.token_type_ids
    return planes


def sliced(output: EncoderOutput, rows: int, length: int) -> EncoderOutput:
    """The first `rows` rows (and `length` columns of per-token outputs) of a bucket's outputs, copied
    out of the buffers the next replay overwrites."""
    return EncoderOutput(hidden=_cut(output.hidden, rows, length), logits=_cut(output.logits, rows, length))


def _cut(value: torch.Tensor | None, rows: int, length: int) -> torch.Tensor | None:
    if value is None:
        return None
    # (B, L, X) per token: hidden states, masked-LM logits; (B, X) per row: pooled heads' logits.
    part = value[:rows, :length] if value.dim() == 3 else value[:rows]
    return part.clone()


def eager(replay: Replay) -> Replay:
    """The bucket's padded batch run eagerly at each call: the same path without a graph."""
    return replay


def cuda_capture(pool: Any) -> Capture:
    """Capture into CUDA graphs that share `pool`. Replays run one at a time and their outputs are
    copied out at once (`Graphs.run`), so a graph may reuse memory another one's capture freed."""

    # One stream for every warm-up and capture: cuBLAS keeps a workspace per stream it runs on.
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]

    def capture(compute: Replay) -> Replay:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            compute()  # outside the capture: lazy set-up (the stream's cuBLAS workspace, kernel choices)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # Only this thread's unsafe calls break the capture: other models may serve meanwhile.
        with torch.cuda.graph(graph, pool=pool, stream=side, capture_error_mode="thread_local"):
            outputs = compute()

        def replay() -> EncoderOutput:
            graph.replay()
            return outputs

        return replay

    return capture


@dataclass
class _Slot:
    inputs: torch.Tensor
    replay: Replay


class Graphs:
    """One model's captured buckets. `run` answers a batch that fits one, else None (run it eager)."""

    def __init__(self, device: str, pad_id: int, types: bool) -> None:
        self.device = device
        self.pad_id = pad_id
        self.types = types
        self.slots: dict[Bucket, _Slot] = {}
        self.choices: tuple[Bucket, ...] = ()
        #: Device memory the capture took: the shared pool and the input buffers.
        self.bytes = 0

    def add(self, bucket: Bucket, compute: Compute, capture: Capture) -> None:
        inputs = torch.zeros((3 if self.types else 2, bucket.rows, bucket.length), dtype=torch.int64)
        inputs[0] = self.pad_id
        inputs[1, :, 0] = 1  # the capture runs on a valid batch: one real token per row
        inputs = inputs.to(self.device)
        extra = {"token_type_ids": inputs[2]} if self.types else {}
        self.slots[bucket] = _Slot(inputs, capture(lambda: compute(inputs[0], inputs[1], extra)))
        self.choices = tuple(sorted(self.slots, key=lambda b: (b.tokens, b)))

    def run(self, batch: EncoderBatch) -> EncoderOutput | None:
        rows, length = batch.input_ids.shape
        bucket = fit(self.choices, rows, length)
        if bucket is None or (batch.token_type_ids is not None and not self.types):
            return None
        slot = self.slots[bucket]
        planes = torch.from_numpy(padded(batch, bucket, self.pad_id, self.types))
        with compute_slot(self.device), torch.inference_mode(), _on(self.device):
            slot.inputs.copy_(planes)
            return sliced(slot.replay(), rows, length)

    def describe(self) -> dict[str, Any]:
        """The buckets captured ("rows x length") and the device memory they take."""
        return {"buckets": [f"{b.rows}x{b.length}" for b in self.choices], "bytes": self.bytes}


def capture_all(
    compute: Compute, device: str, longest: int, pad_id: int, types: bool, capture: Capture | None = None
) -> Graphs:
    """`compute` captured for every bucket up to `longest` tokens, largest first (the smaller ones
    then reuse the memory the larger ones' intermediates freed); `capture`: CUDA graphs by default."""
    graphs = Graphs(device, pad_id, types)
    with _on(device), torch.inference_mode():
        before = _reserved(device)
        capture = capture or cuda_capture(torch.cuda.graph_pool_handle())
        for bucket in reversed(buckets(longest)):
            graphs.add(bucket, compute, capture)
        graphs.bytes = max(0, _reserved(device) - before)
    return graphs


def _reserved(device: str) -> int:
    """Bytes torch holds on `device` once its cache of freed blocks is given back (0 off CUDA)."""
    if not device.startswith("cuda"):
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return int(torch.cuda.memory_reserved(device))


@contextlib.contextmanager
def _on(device: str) -> Iterator[None]:
    """`device` as the current CUDA device (graphs replay on the current device's stream)."""
    if not device.startswith("cuda"):
        yield
        return
    with torch.cuda.device(torch.device(device)):
        yield


def load(options: EngineOptions, compute: Compute, config: Any, device: str) -> tuple[Graphs | None, str]:
    """A loaded model's graphs as `options.cuda_graphs` asks, or None and why not. `cuda_graphs: true`
    that cannot be honoured is refused (`ModelUnavailable`), naming what stands in the way."""
    setting = options.cuda_graphs
    if setting is False:
        return None, "cuda_graphs: false"
    why = unfit(device, config, options)
    if why is not None:
        if setting is True:
            raise ModelUnavailable(f"cuda_graphs: true cannot be honoured: {why}; set cuda_graphs: auto or false")
        return None, why
    try:
        graphs = capture_all(compute, device, *layout(config))
    except Exception as error:  # any failed capture leaves the model eager
        if setting is True:
            raise ModelUnavailable(f"cuda_graphs: true: the capture failed on {device}: {error}") from error
        log.warning("CUDA graph capture failed on %s; the model runs eager: %s", device, error)
        _reserved(device)  # what the failed capture held goes back
        return None, f"the capture failed ({type(error).__name__}); eager"
    return graphs, f"{len(graphs.choices)} buckets captured"


def layout(config: Any) -> tuple[int, int, bool]:
    """What the buckets of a model of `config` hold: its longest sequence (its positions), the id
    its padding takes, and whether it takes token types."""
    start = packed.position_start(config) or 0
    positions = int(getattr(config, "max_position_embeddings", 0) or 0) - start
    longest = positions if positions > 0 else max(LENGTHS)
    pad_id = int(getattr(config, "pad_token_id", None) or 0)
    return longest, pad_id, getattr(config, "type_vocab_size", None) is not None


def unfit(device: str, config: Any, options: EngineOptions) -> str | None:
    """Why a model's forward is not captured on `device`, or None where it is. `auto` also leaves
    out what a capture runs but the GPU tests do not check, or what costs more memory than it saves."""
    model_type = getattr(config, "model_type", None)
    if not device.startswith("cuda"):
        return f"CUDA graphs replay on a CUDA device; this model runs on {device}"
    if options.trust_remote_code and getattr(config, "auto_map", None):
        return "the model runs code of its own (trust_remote_code), whose control flow a capture cannot check"
    if model_type not in FAMILIES:
        return f"model type '{model_type}' is not captured (captured: {', '.join(FAMILIES)})"
    if options.cuda_graphs is True:
        return None
    if options.task == "masked-lm":
        vocabulary = int(getattr(config, "vocab_size", 0) or 0)
        return (
            f"masked-lm outputs {vocabulary} vocabulary logits per token, which every bucket would keep "
            "in the graphs' memory; cuda_graphs: true captures it anyway"
        )
    if options.quantize != "none":
        return f"quantize: {options.quantize} is not checked under capture; cuda_graphs: true captures it anyway"
    return None
