"""Dense text embeddings on torch: transformer -> pooling -> Dense layers -> normalisation.

Reads the sentence-transformers layout (or a plain transformers directory) as `detect` found it,
so its output equals sentence-transformers `encode` on the same directory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.dlpack import from_dlpack

from model_registry.adapters import segments
from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.adapters.engines import engines_for
from model_registry.adapters.items import embed_item
from model_registry.adapters.pooling import exclude_prompt, pool
from model_registry.adapters.text import TextTokenizer, Tokens, text_tokens
from model_registry.backends import create_engine
from model_registry.backends.base import EncoderBatch, EncoderOutput, Engine, EngineOptions, Packed, Task
from model_registry.backends.cache import UnsafeCache
from model_registry.backends.choice import Choice
from model_registry.backends.torch import engine as backend
from model_registry.backends.weights import weight_bytes
from model_registry.detection.layout import DenseLayer, Layout
from model_registry.errors import ModelUnavailable, UnsupportedOperation
from model_registry.types import (
    Capability,
    Embedding,
    EmbedItem,
    Item,
    Kind,
    Output,
    Prepared,
    Result,
)

_ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": torch.nn.Identity,
    "torch.nn.modules.activation.Tanh": torch.nn.Tanh,
    "torch.nn.modules.activation.ReLU": torch.nn.ReLU,
    "torch.nn.modules.activation.GELU": torch.nn.GELU,
    "torch.nn.modules.activation.Sigmoid": torch.nn.Sigmoid,
}

#: A padding-free batch is charged its real tokens, but its rows still arrive padded on the host
#: (ids and masks, (batch, longest)): so it is cut where its padded size would pass this many
#: times the budget, which keeps those (a few bytes a position) far below what the warm-up batch's
#: real tokens take on the device (kilobytes a token) however its lengths mix.
PADDED_SPREAD = 4

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TextBatch:
    """The engine's inputs plus, on CPU, the attention mask and the mask of tokens that pool."""

    inputs: EncoderBatch
    attention_mask: torch.Tensor
    pool_mask: torch.Tensor
    #: Each row's token ranges pooled one by one (late chunking); empty rows pool as a whole.
    spans: tuple[tuple[tuple[int, int], ...], ...] = ()


def as_tensor(value: Any, device: str | None = None) -> torch.Tensor:
    """An engine's output (see `EncoderOutput`) as a torch tensor on `device` (None: where it is),
    without a copy when it is there already: a numpy array or torch tensor, CTranslate2's CUDA
    `StorageView` through the CUDA array interface, ONNX Runtime's `OrtValue` through DLPack."""
    if isinstance(value, (torch.Tensor, np.ndarray)) or not hasattr(value, "__dlpack__"):
        return torch.as_tensor(value, device=device)
    tensor = from_dlpack(value)
    return tensor if device is None else tensor.to(device)


def load_dense_layer(layer: DenseLayer, device: str, dtype: torch.dtype) -> torch.nn.Sequential:
    """A sentence-transformers Dense module (linear + activation) from its directory."""
    if layer.activation not in _ACTIVATIONS:
        raise UnsupportedOperation(f"Dense activation '{layer.activation}' in {layer.path} is not supported")
    linear = torch.nn.Linear(layer.in_features, layer.out_features, bias=layer.bias)
    if (layer.path / "model.safetensors").is_file():
        from safetensors.torch import load_file

        state = load_file(str(layer.path / "model.safetensors"))
    else:
        state = torch.load(layer.path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    linear.load_state_dict({k.removeprefix("linear."): v for k, v in state.items()})
    return torch.nn.Sequential(linear, _ACTIVATIONS[layer.activation]()).to(device=device, dtype=dtype).eval()


def span_rows(
    spans: Sequence[tuple[tuple[int, int], ...]], attention: torch.Tensor, pool_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Late chunking's pooling rows: a row without spans pools once with its own mask, a row with
    spans once per span over that span's tokens (positions counted from its first real token)."""
    rows: list[int] = []
    masks: list[torch.Tensor] = []
    for row, ranges in enumerate(spans):
        if not ranges:
            rows.append(row)
            masks.append(pool_mask[row])
            continue
        first = int(attention[row].nonzero()[0])
        for start, stop in ranges:
            mask = torch.zeros_like(pool_mask[row])
            mask[first + start : first + stop] = 1
            rows.append(row)
            masks.append(mask)
    return torch.tensor(rows, device=attention.device), torch.stack(masks)


class TextEncoder(Adapter):
    """What every transformer text adapter shares: the engine, tokenizing, padding, sizes.

    The engine (torch, ONNX Runtime or CTranslate2) runs the transformer; the heads this module
    and its subclasses add on top run on torch, on `head_device`, whatever the engine."""

    backend = "torch"
    #: Whether this family's heads are small (pooling, a normalisation, a classifier's linear
    #: layers), so that on a CPU engine other than torch the forward thread runs them on one of
    #: torch's threads (`on_forward_thread`). SPLADE's vocabulary-wide head is not: one batch of
    #: 1,024 tokens takes 140 ms on two threads and 250 on one (2-core host).
    small_heads = True
    #: Which end of an over-long text may be cut (`text_tokens` honours `EmbedItem.truncate_left`).
    truncation_sides: tuple[str, ...] = ("right", "left")
    #: Whether `text_tokens` honours `EmbedItem.max_tokens` (a request's own token limit).
    token_caps = True
    #: What the engine's forward returns for this family.
    task: Task = "feature-extraction"

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        self.layout = layout
        self.trust_remote_code = trust_remote_code
        self.prompts = dict(layout.prompts)
        self.default_prompt_name = layout.default_prompt_name
        self.engine: Engine | None = None
        self._built: Engine | None = None
        #: The engines still to try, in order, the first the one `_built` was built by.
        self._choices: tuple[Choice, ...] = ()
        #: Why the engines tried before the first of `_choices` could not serve the model.
        self._failed: list[str] = []
        self.choice = Choice("torch", "configured")
        self.config: Any = None
        self.tokenizer: TextTokenizer | None = None
        self.device = "cpu"
        self.dtype: Any = torch.float32
        self.head_device = "cpu"
        self.head_dtype = torch.float32
        self._footprint = 0

    def load_model(self, options: LoadOptions) -> None:
        """Tokenizer, config and the engine for `self.task`; sizes the footprint."""
        from transformers import AutoConfig

        directory = self.layout.transformer_dir
        config = AutoConfig.from_pretrained(str(directory), trust_remote_code=self.trust_remote_code)
        self.config = config
        self.tokenizer = TextTokenizer(
            directory, max_length=self.layout.max_length, config=config, do_lower_case=self.layout.do_lower_case
        )
        self.max_length = self.tokenizer.max_length
        device = backend.resolve_device(options.device)
        # The device as resolved here, which the engine choice and the memory accounting also use:
        # onnxruntime's CUDA build lists its provider on a machine without a GPU too.
        engine_options = self.engine_options(options, device)
        engine = self._first_that(options, device, lambda e: e.load(directory, engine_options), self._built)
        self._built = None
        self.engine, self.backend = engine, engine.name
        self.device, self.dtype = engine.device, engine.dtype
        # The heads run where the engine leaves its outputs: on its device (see `EncoderOutput`).
        self.head_device = engine.device
        if isinstance(engine, backend.TorchEngine):
            self.head_dtype = engine.torch_dtype
            self.dtype = engine.torch_dtype
        working = backend.activation_estimate(config, options.max_batch_tokens, self.max_length, torch.float32)
        self._footprint = engine.footprint() + working

    def text_tokenizer(self) -> TextTokenizer | None:
        return self.tokenizer

    def build(self, options: LoadOptions) -> None:
        """The engine's export or conversion, kept for `load_model`."""
        device = backend.resolve_device(options.device)
        self._choices = ()
        engine_options = self.engine_options(options, device)
        self._built = self._first_that(options, device, lambda e: e.build(self.layout.transformer_dir, engine_options))

    def _first_that(
        self, options: LoadOptions, device: str, step: Callable[[Engine], None], built: Engine | None = None
    ) -> Engine:
        """The first engine of the choice on which `step` (its build, or its load) succeeds; `built`,
        where given, is the first one's, already built. Under `backend: auto` an engine that cannot
        build or load the model hands over to the next, torch last, and `/models` says why."""
        if not self._choices:
            self._choices, self._failed = self.engine_choices(options, device), []
        for index, choice in enumerate(self._choices):
            engine = built if built is not None and index == 0 else create_engine(choice.backend)
            try:
                step(engine)
            except ModelUnavailable as error:
                if index == len(self._choices) - 1 or isinstance(error, UnsafeCache):
                    raise
                log.warning(
                    "model %s: %s could not serve it (%s); trying %s",
                    self.layout.root,
                    choice.backend,
                    error,
                    self._choices[index + 1].backend,
                )
                self._failed.append(f"{choice.backend} could not serve it: {error}")
                continue
            self._choices = self._choices[index:]
            reason = "; ".join([choice.reason, *self._failed])
            self.choice = Choice(choice.backend, reason)
            return engine
        raise AssertionError("This is a bug: no engine was tried")

    def engine_choices(self, options: LoadOptions, device: str) -> tuple[Choice, ...]:
        """The engines to try, in order (`backends.choice.choices`)."""
        found = engines_for(str(self.layout.root), options, self.layout, device.startswith("cuda"))
        self.choice = found[0]
        if options.cuda_graphs is True and found[0].backend != "torch":
            raise ModelUnavailable(
                f"cuda_graphs: true captures the torch engine, but this model runs on {found[0].backend} "
                f"({found[0].reason}); set backend: torch"
            )
        return found

    def engine_options(self, options: LoadOptions, device: str) -> EngineOptions:
        return EngineOptions(
            task=self.task,
            device=device,
            dtype=options.dtype,
            quantize=options.quantize,
            threads=options.threads,
            cache_dir=options.cache_dir,
            trust_remote_code=self.trust_remote_code,
            cuda_graphs=options.cuda_graphs,
        )

    def on_forward_thread(self) -> None:
        """On a CPU engine other than torch, where the heads are small, torch runs them on this
        thread alone: its pool's other threads would spin for milliseconds after each parallel
        operator on the cores the engine's threads are using (CTranslate2 int8 on 2 cores, over
        HTTP against in process: 0.85 of its rate with them, 0.91-1.02 without). On CUDA the engine
        needs no cores and the heads run on the device with its outputs (see `EncoderOutput`), so
        there the thread keeps torch's pool."""
        if self.small_heads and self.backend != "torch" and not str(self.device).startswith("cuda"):
            backend.confine(1)

    def run(self, inputs: EncoderBatch) -> EncoderOutput:
        assert self.engine is not None, "This is a bug: forward() called before load()"
        return self.engine.run(inputs)

    @property
    def padding_free(self) -> bool:
        """Whether the engine runs this model's batches on their real tokens alone."""
        return isinstance(self.engine, backend.TorchEngine) and self.engine.kernel is not None

    def batch_cost(self, count: int, longest: int, total: int) -> int:
        """Padded tokens on a padded engine; real tokens on a padding-free one, its padded size
        (what the host still lays out) held within `PADDED_SPREAD` budgets."""
        if not self.padding_free:
            return count * longest
        return max(total, -(-count * longest // PADDED_SPREAD))

    def states(self, output: EncoderOutput) -> torch.Tensor:
        """The engine's last hidden state as a tensor on the heads' device, in the heads' dtype."""
        return as_tensor(output.hidden, self.head_device).to(self.head_dtype)

    def unload(self) -> None:
        if self.engine is not None:
            self.engine.release()
        self.engine = None
        self.tokenizer = None

    def footprint(self) -> int:
        return self._footprint

    def describe(self) -> dict[str, Any]:
        """The family's facts plus the engine: which one runs the model and why."""
        engine = {"backend": self.choice.backend, "reason": self.choice.reason}
        if self.engine is not None:
            engine.update(self.engine.describe())
            engine.setdefault("attention", "padded")  # ONNX Runtime and CTranslate2 run padded batches
            engine["budget_counts"] = "real_tokens" if self.padding_free else "padded_tokens"
        return {**self.family_facts(), "engine": engine, **self.layout.notes}

    def family_facts(self) -> dict[str, Any]:
        return {}

    def estimate(self, options: LoadOptions) -> int:
        """Weight files on disk plus the working memory of a full batch, before loading."""
        from transformers import AutoConfig

        directory = self.layout.transformer_dir
        config = AutoConfig.from_pretrained(str(directory), trust_remote_code=self.trust_remote_code)
        # Converting engines keep float32 activations on CPU; their working memory is sized so.
        # `auto` runs in the device's default precision whichever engine it takes.
        dtype = torch.float32
        if options.backend in ("torch", "auto"):
            device = backend.resolve_device(options.device)
            dtype = backend.resolve_dtype(options.dtype, device, getattr(config, "model_type", None))
        working = backend.activation_estimate(config, options.max_batch_tokens, self.layout.max_length, dtype)
        return weight_bytes(self.layout.root) + working

    def text_tokens(self, items: Sequence[EmbedItem]) -> list[Tokens]:
        """Tokenize text and token-id items of one request, prompts prepended (`text.text_tokens`)."""
        assert self.tokenizer is not None, "This is a bug: prepare() called before load()"
        return text_tokens(self.tokenizer, items, include_prompt=self.layout.include_prompt)

    def text_batch(self, items: Sequence[Prepared]) -> TextBatch:
        assert self.tokenizer is not None, "This is a bug: collate() called before load()"
        padded = self.tokenizer.pad([p.data.ids for p in items])
        attention = torch.from_numpy(padded.attention_mask)
        inputs = EncoderBatch(padded.input_ids, padded.attention_mask)
        prompts = [p.data.prompt_tokens for p in items]
        spans = tuple(p.data.spans for p in items) if any(p.data.spans for p in items) else ()
        if not any(prompts):  # checked here, not by three tensor operations: 0.15 ms after an idle spell
            return TextBatch(inputs, attention, attention, spans)
        return TextBatch(inputs, attention, exclude_prompt(attention, torch.tensor(prompts)), spans)


class DenseAdapter(TextEncoder):
    kind = Kind.DENSE
    capabilities = frozenset({Capability.EMBED_TEXT})

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        super().__init__(layout, trust_remote_code)
        self.head: list[torch.nn.Module] = []
        self.similarity = layout.similarity

    def load(self, options: LoadOptions) -> None:
        self.load_model(options)
        self.head = [load_dense_layer(layer, self.head_device, self.head_dtype) for layer in self.layout.dense_layers]
        hidden = int(getattr(self.config, "hidden_size", 0))
        self.dimensions = self.layout.dense_layers[-1].out_features if self.layout.dense_layers else hidden
        if self.layout.truncate_dim is not None:
            self.dimensions = min(self.dimensions, self.layout.truncate_dim)
        self._footprint += sum(backend.module_bytes(m) for m in self.head)

    def unload(self) -> None:
        self.head = []
        super().unload()

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        embed_items = [self._check(i, item) for i, item in enumerate(items)]
        tokens = self.text_tokens(embed_items)
        tokens = [
            Tokens(t.ids, t.prompt_tokens, e.spans) if e.spans else t for t, e in zip(tokens, embed_items, strict=True)
        ]
        return [Prepared(i, len(t.ids), len(t.ids), t) for i, t in enumerate(tokens)]

    def _check(self, index: int, item: Item) -> EmbedItem:
        return embed_item(item, frozenset({Output.DENSE}), "a dense embedding model")

    def collate(self, items: Sequence[Prepared]) -> TextBatch:
        return self.text_batch(items)

    def forward(self, batch: TextBatch) -> torch.Tensor:
        output = self.run(batch.inputs)
        with torch.inference_mode():
            states = self.states(output)
            if output.packed is not None:
                vectors = self.pool_packed(batch, states, output.packed)
            else:
                to = states.device
                attention, pool_mask = batch.attention_mask.to(to), batch.pool_mask.to(to)
                if batch.spans:
                    rows, pool_mask = span_rows(batch.spans, attention, pool_mask)
                    states, attention = states[rows], attention[rows]
                vectors = pool(states, pool_mask, attention, self.layout.pooling)
            for module in self.head:
                vectors = module(vectors.to(self.head_dtype)).float()
            if self.layout.normalize:
                vectors = torch.nn.functional.normalize(vectors, p=2, dim=1)
            if self.layout.truncate_dim is not None:  # cut after the Normalize module, as saved: not renormalised
                vectors = vectors[:, : self.layout.truncate_dim]
            return vectors.float().cpu()

    def pool_packed(self, batch: TextBatch, states: torch.Tensor, packed: Packed) -> torch.Tensor:
        """Pooling on a padding-free batch's (tokens, hidden) states, per sequence or span."""
        if not batch.spans:
            weights = segments.tokens(batch.pool_mask, packed)
            return segments.pool(states, weights, packed.segments, packed.cu_seqlens, self.layout.pooling)
        index, rows, weights, cu_seqlens = segments.span_segments(batch.spans, batch.pool_mask, packed)
        return segments.pool(states[index], weights, rows, cu_seqlens, self.layout.pooling)

    def postprocess(self, batch: TextBatch, output: torch.Tensor) -> list[Result]:
        array = np.ascontiguousarray(output.numpy(), dtype=np.float32)
        if not batch.spans:
            return [Embedding(dense=row) for row in array]
        results: list[Result] = []
        for spans in batch.spans:
            taken, array = array[: max(1, len(spans))], array[max(1, len(spans)) :]
            results.append(Embedding(multivector=taken) if spans else Embedding(dense=taken[0]))
        return results

    def family_facts(self) -> dict[str, Any]:
        return {
            "pooling": self.layout.pooling,
            "normalize": self.layout.normalize,
            "prompts": sorted(self.layout.prompts),
            "default_prompt_name": self.layout.default_prompt_name,
            "similarity_fn_name": self.similarity.value,
        }
