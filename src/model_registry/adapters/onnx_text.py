"""Dense text embedders on the model's own ONNX graph, for the install without torch.

The install with the `onnx` extra alone has ONNX Runtime, tokenizers and numpy, and neither torch
nor transformers. A sentence-transformers model whose repository ships its graph
(`onnx/model.onnx`, and the quantized variants `quantize: int8` picks by the CPU's instruction
set) is served from it: the tokenizer read from its files (`FileTokenizer`), the graph on
ONNX Runtime, then the pipeline's pooling, Dense layers, normalisation and `truncate_dim` on
numpy, as `SentenceTransformer.encode` computes them. Anything that needs torch (an export, a
Dense layer saved as a pickle, late chunking) is refused naming the extra that adds it.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.adapters.items import embed_item
from model_registry.adapters.pairs import activation_name, encode_pairs, padded, score
from model_registry.adapters.static import normalized
from model_registry.adapters.text import TextTokenizer, text_tokens
from model_registry.backends.base import EncoderBatch, EngineOptions, Task
from model_registry.backends.weights import activation_bytes
from model_registry.detection.layout import DenseLayer, Layout
from model_registry.errors import InvalidInput, ModelUnavailable, UnsupportedOperation
from model_registry.types import (
    Capability,
    Embedding,
    EmbedItem,
    Item,
    Kind,
    Output,
    PairItem,
    Prepared,
    Result,
    Text,
    TokenIds,
)
from model_registry.zoo.files import label_count

ENGINE = "onnx"
_TORCH = "pip install 'infinity-server[torch]'"
_WHY = "the only engine installed that serves it (the model's own ONNX graph; torch is not installed)"


def light_config(config: dict[str, Any]) -> SimpleNamespace:
    """config.json as the attributes `TextTokenizer` reads of transformers' config: a rotary model
    (`rope_theta` in its file) gets the `rope_parameters` transformers 5 gives it."""
    values = dict(config)
    if "rope_theta" in values or "rope_scaling" in values:
        values.setdefault("rope_parameters", {"rope_theta": values.get("rope_theta")})
    return SimpleNamespace(**values)


# ---- sentence-transformers' pooling, Dense and Normalize modules, on numpy ---------------------


def exclude_prompt(mask: np.ndarray, prompt_tokens: np.ndarray) -> np.ndarray:
    """Zero the first `prompt_tokens[i]` real tokens of row i (left padding included)."""
    if not (prompt_tokens > 0).any():
        return mask
    first_real = mask.argmax(axis=1)
    positions = np.arange(mask.shape[1])[None, :]
    return np.where(positions < (first_real + prompt_tokens)[:, None], 0, mask)


def pool(states: np.ndarray, mask: np.ndarray, attention: np.ndarray, mode: str) -> np.ndarray:
    """(batch, tokens, hidden) -> (batch, hidden) in float32, as sentence-transformers' Pooling."""
    states = states.astype(np.float32, copy=False)
    rows = np.arange(states.shape[0])
    weights = mask.astype(np.float32)
    pooled: np.ndarray
    if mode == "cls":
        pooled = states[rows, mask.argmax(axis=1)]
    elif mode == "lasttoken":
        length = attention.shape[1]
        flipped = attention[:, ::-1]
        values, from_end = flipped.max(axis=1), flipped.argmax(axis=1)
        last = length - 1 - np.where(values == 0, length - 1, from_end)
        pooled = states[rows, last] * values[:, None].astype(np.float32)
    elif mode == "max":
        pooled = np.where(mask[:, :, None] == 0, -np.inf, states).max(axis=1)
    elif mode in ("mean", "mean_sqrt_len_tokens"):
        count = np.maximum(weights.sum(axis=1, keepdims=True), 1e-9)
        pooled = np.einsum("bt,bth->bh", weights, states) / (count if mode == "mean" else np.sqrt(count))
    elif mode == "weightedmean":
        position = np.arange(1, states.shape[1] + 1, dtype=np.float32)[None, :]
        pad_lengths = attention.argmax(axis=1).astype(np.float32)
        weighted = weights * (position - pad_lengths[:, None])
        pooled = np.einsum("bt,bth->bh", weighted, states) / np.maximum(weighted.sum(axis=1, keepdims=True), 1e-9)
    else:
        raise ValueError(f"unknown pooling mode '{mode}'")
    return pooled


_erf = np.vectorize(math.erf, otypes=[np.float64])

_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "torch.nn.modules.linear.Identity": lambda x: x,
    "torch.nn.modules.activation.Tanh": np.tanh,
    "torch.nn.modules.activation.ReLU": lambda x: np.maximum(x, 0),
    "torch.nn.modules.activation.GELU": lambda x: (0.5 * x * (1 + _erf(x / math.sqrt(2)))).astype(x.dtype),
    "torch.nn.modules.activation.Sigmoid": lambda x: 1 / (1 + np.exp(-x)),
}
#: The inputs `OnnxEngine.run` feeds an encoder's graph.
_FED = frozenset({"input_ids", "attention_mask", "token_type_ids"})


def _unfed_inputs(session: Any) -> list[str]:
    return sorted(i.name for i in session.get_inputs() if i.name not in _FED)


@dataclass(frozen=True)
class Linear:
    """A sentence-transformers Dense module: `activation(x @ weight.T + bias)`."""

    weight: np.ndarray
    bias: np.ndarray | None
    activation: str

    def __call__(self, vectors: np.ndarray) -> np.ndarray:
        out = vectors @ self.weight.T
        if self.bias is not None:
            out = out + self.bias
        result: np.ndarray = _ACTIVATIONS[self.activation](out)
        return result

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes + (0 if self.bias is None else self.bias.nbytes)


def read_dense(layer: DenseLayer) -> Linear:
    """A Dense module's weights from its `model.safetensors`; a pickled one needs torch to read."""
    from safetensors import safe_open

    path = layer.path / "model.safetensors"
    if not path.is_file():
        raise ModelUnavailable(f"{layer.path} keeps its Dense weights in a format only torch reads; {_TORCH}")
    if layer.activation not in _ACTIVATIONS:
        raise ModelUnavailable(f"{layer.path}: the activation {layer.activation} needs torch; {_TORCH}")
    with safe_open(str(path), framework="numpy") as weights:
        tensors = {name: weights.get_tensor(name) for name in weights.keys()}  # noqa: SIM118
    weight = tensors.get("linear.weight")
    if weight is None or weight.shape != (layer.out_features, layer.in_features):
        raise ModelUnavailable(f"{path} holds no linear.weight of shape ({layer.out_features}, {layer.in_features})")
    bias = tensors.get("linear.bias") if layer.bias else None
    if layer.bias and bias is None:
        raise ModelUnavailable(f"{path} holds no linear.bias, which its config.json declares")
    return Linear(weight.astype(np.float32), None if bias is None else bias.astype(np.float32), layer.activation)


@dataclass(frozen=True)
class Batch:
    inputs: EncoderBatch
    #: The tokens that pool: the attention mask, less each text's prompt where the model excludes it.
    pool_mask: np.ndarray


class OnnxText(Adapter):
    """What the text adapters on a shipped graph share: the engine, the tokenizer from the files,
    sizes and `/models`' facts."""

    backend = ENGINE
    token_caps = True
    truncation_sides = ("right", "left")
    task: Task = "feature-extraction"

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        self.layout = layout
        self.device = "cpu"
        self.dtype = "float32"
        self.engine: Any = None
        self.tokenizer: TextTokenizer | None = None
        self.config = light_config(layout.config)
        self._footprint = 0
        self.reason = f"auto: {ENGINE}, {_WHY}"

    def load_engine(self, options: LoadOptions) -> None:
        """The graph on ONNX Runtime and the tokenizer; a combination that needs torch raises."""
        if options.backend not in ("auto", ENGINE):
            raise ModelUnavailable(
                f"backend: {options.backend} needs torch, which is not installed; {_TORCH} "
                f"(without torch, a model runs on its own ONNX graph: backend: auto or {ENGINE})"
            )
        if importlib.util.find_spec("onnxruntime") is None:
            raise ModelUnavailable(
                "this model needs torch, or ONNX Runtime to run the ONNX graph it ships: pip install "
                f"'infinity-server[onnx]' (models that ship onnx/model.onnx) or {_TORCH.removeprefix('pip install ')}"
            )
        from model_registry.backends.onnx.engine import OnnxEngine

        directory = self.layout.transformer_dir
        engine = OnnxEngine()
        settings = EngineOptions(
            task=self.task,
            device=options.device,
            dtype=options.dtype,
            quantize=options.quantize,
            threads=options.threads,
            cache_dir=options.cache_dir,
        )
        engine.load(directory, settings)  # a model without its graph: the export's missing extra
        unfed = _unfed_inputs(engine.session)
        if unfed:
            raise ModelUnavailable(
                f"{engine.path} takes inputs this server does not feed ({', '.join(unfed)}): a graph exported for "
                f"generation, not as an encoder; {_TORCH}, which exports the encoder itself"
            )
        self.tokenizer = TextTokenizer(
            directory,
            max_length=self.layout.max_length,
            config=self.config,
            do_lower_case=self.layout.do_lower_case,
            from_files=True,
        )
        self.max_length = self.tokenizer.max_length
        self.reason = "configured" if options.backend == ENGINE else f"auto: {ENGINE}, {_WHY}"
        self.engine, self.device, self.dtype = engine, engine.device, engine.dtype
        working = activation_bytes(self.config, options.max_batch_tokens, self.max_length, 4)
        self._footprint = engine.footprint() + working

    def unload(self) -> None:
        if self.engine is not None:
            self.engine.release()
        self.engine = None
        self.tokenizer = None

    def footprint(self) -> int:
        return self._footprint

    def estimate(self, options: LoadOptions) -> int:
        from model_registry.backends.onnx.engine import own_candidates

        graphs = own_candidates(self.layout.transformer_dir, options.quantize, False)
        weights = 0 if not graphs else sum(p.stat().st_size for p in graphs[0].parent.glob(graphs[0].name + "*"))
        return weights + activation_bytes(self.config, options.max_batch_tokens, self.layout.max_length, 4)

    def text_tokenizer(self) -> TextTokenizer | None:
        return self.tokenizer

    def outputs(self, inputs: EncoderBatch) -> Any:
        """The engine's output for a batch, as a numpy array (an OrtValue on CUDA is copied here)."""
        assert self.engine is not None, "This is a bug: forward() called before load()"
        output = self.engine.run(inputs)
        value = output.hidden if self.task == "feature-extraction" else output.logits
        return value.numpy() if hasattr(value, "numpy") else np.asarray(value)

    def describe(self) -> dict[str, Any]:
        engine: dict[str, Any] = {"backend": ENGINE, "reason": self.reason}
        if self.engine is not None:
            engine.update(self.engine.describe())
            engine.update(attention="padded", budget_counts="padded_tokens")
        return {**self.family_facts(), "engine": engine, **self.layout.notes}

    def family_facts(self) -> dict[str, Any]:
        return {}


class OnnxDense(OnnxText):
    """A dense embedder on its shipped ONNX graph, computed without torch (see the module)."""

    kind = Kind.DENSE
    capabilities = frozenset({Capability.EMBED_TEXT})

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        super().__init__(layout, trust_remote_code)
        self.prompts = dict(layout.prompts)
        self.default_prompt_name = layout.default_prompt_name
        self.similarity = layout.similarity
        self.head: list[Linear] = []

    def load(self, options: LoadOptions) -> None:
        self.load_engine(options)
        self.head = [read_dense(layer) for layer in self.layout.dense_layers]
        hidden = int(getattr(self.config, "hidden_size", 0))
        self.dimensions = self.layout.dense_layers[-1].out_features if self.layout.dense_layers else hidden
        if self.layout.truncate_dim is not None:
            self.dimensions = min(self.dimensions, self.layout.truncate_dim)
        self._footprint += sum(layer.nbytes for layer in self.head)

    def unload(self) -> None:
        self.head = []
        super().unload()

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        assert self.tokenizer is not None, "This is a bug: prepare() called before load()"
        checked = [self._check(i, item) for i, item in enumerate(items)]
        tokens = text_tokens(self.tokenizer, checked, include_prompt=self.layout.include_prompt)
        return [Prepared(i, len(t.ids), len(t.ids), t) for i, t in enumerate(tokens)]

    def _check(self, index: int, item: Item) -> EmbedItem:
        checked = embed_item(item, frozenset({Output.DENSE}), "a dense embedding model")
        if not isinstance(checked.content, Text | TokenIds):
            raise InvalidInput(f"input {index}: this model embeds text only", param="input")
        if checked.spans:
            raise InvalidInput(
                f"input {index}: late chunking pools spans of the token states on torch, which is not "
                f"installed; {_TORCH}",
                param="input",
            )
        return checked

    def collate(self, items: Sequence[Prepared]) -> Batch:
        assert self.tokenizer is not None, "This is a bug: collate() called before load()"
        ids = self.tokenizer.pad([p.data.ids for p in items])
        prompts = np.asarray([p.data.prompt_tokens for p in items], dtype=np.int64)
        inputs = EncoderBatch(ids.input_ids, ids.attention_mask)
        return Batch(inputs, exclude_prompt(ids.attention_mask, prompts))

    def forward(self, batch: Batch) -> np.ndarray:
        states = self.outputs(batch.inputs)
        vectors = pool(states, batch.pool_mask, batch.inputs.attention_mask, self.layout.pooling)
        for layer in self.head:
            vectors = layer(vectors)
        if self.layout.normalize:
            vectors = normalized(vectors)
        if self.layout.truncate_dim is not None:  # cut after the Normalize module, as saved: not renormalised
            vectors = vectors[:, : self.layout.truncate_dim]
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def postprocess(self, batch: Batch, output: np.ndarray) -> list[Result]:
        return [Embedding(dense=row) for row in output]

    def family_facts(self) -> dict[str, Any]:
        return {
            "pooling": self.layout.pooling,
            "normalize": self.layout.normalize,
            "prompts": sorted(self.layout.prompts),
            "default_prompt_name": self.layout.default_prompt_name,
            "similarity_fn_name": self.similarity.value,
        }


class OnnxCrossEncoder(OnnxText):
    """A cross-encoder reranker on its shipped ONNX graph (its `logits`), scored as
    sentence-transformers' `CrossEncoder.predict` scores: the pair cut from the document first,
    the model's activation (sigmoid unless its config says identity) on its one logit."""

    kind = Kind.RERANKER
    capabilities = frozenset({Capability.RERANK})
    task: Task = "sequence-classification"

    def load(self, options: LoadOptions) -> None:
        labels = label_count(self.layout.config)
        if labels != 1:
            raise ModelUnavailable(f"a reranker needs one output label, this model has {labels}; {_TORCH}")
        self.load_engine(options)
        assert self.tokenizer is not None
        self.tokenizer.enable_pairs()
        self.uses_type_ids = "token_type_ids" in self.engine.inputs
        self.activation = activation_name(self.layout.config)

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        assert self.tokenizer is not None, "This is a bug: prepare() called before load()"
        pairs = []
        for item in items:
            if not isinstance(item, PairItem) or item.media is not None:
                raise UnsupportedOperation(
                    f"a reranker scores (query, document) pairs of texts; it cannot take {type(item).__name__}"
                )
            pairs.append(item)
        encoded = encode_pairs(self.tokenizer, pairs)
        return [Prepared(i, len(e.ids), len(e.ids), e) for i, e in enumerate(encoded)]

    def collate(self, items: Sequence[Prepared]) -> EncoderBatch:
        assert self.tokenizer is not None, "This is a bug: collate() called before load()"
        return padded(self.tokenizer, [p.data for p in items], type_ids=self.uses_type_ids)

    def forward(self, batch: EncoderBatch) -> np.ndarray:
        return np.asarray(self.outputs(batch), dtype=np.float32)

    def postprocess(self, batch: EncoderBatch, output: np.ndarray) -> list[Result]:
        return [score(float(logit), self.activation) for logit in output[:, 0]]

    def family_facts(self) -> dict[str, Any]:
        return {"activation": self.activation if self.engine is not None else None, "decoder": False}
