"""sentence-transformers' SparseStaticEmbedding: a weight per vocabulary token (an IDF table), a
text's sparse vector the weights of the tokens it holds, each once.

It is the query side of the inference-free sparse models (opensearch-neural-sparse-encoding-doc-v3,
behind a Router whose document side is a SPLADE model), computed as the module computes it, on
numpy and tokenizers alone: the tokenizer as saved, no special tokens, cut at the tokenizer's
`model_max_length`; a token present in the text weighs its table entry, however often it occurs.
Options (the model entry's `options`) as for SPLADE: `top_k` keeps the k largest weights,
`threshold` drops weights at or below it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.adapters.items import embed_item
from model_registry.adapters.static import ENGINE, encode_ids, given_ids, refused_settings
from model_registry.detection.layout import Layout, read_json
from model_registry.errors import ConfigError, InputTooLong, InvalidInput, ModelUnavailable
from model_registry.types import (
    Capability,
    Embedding,
    EmbedItem,
    Item,
    Kind,
    Output,
    Prepared,
    Result,
    SparseVector,
    Text,
    TokenIds,
)

_SPARSE = frozenset({Output.SPARSE})
_WHY = "a SparseStaticEmbedding module: each token's weight read from a table on numpy, run by no engine"
#: transformers' `model_max_length` of a tokenizer saved without one (no limit).
_UNBOUNDED = 10**12


class SparseStaticAdapter(Adapter):
    kind = Kind.SPARSE
    capabilities = frozenset({Capability.SPARSE})
    backend = ENGINE
    computes_inline = True

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        self.layout = layout
        self.directory = layout.module_dirs.get("SparseStaticEmbedding", layout.transformer_dir)
        self.prompts = dict(layout.prompts)
        self.default_prompt_name = layout.default_prompt_name
        self.device = "cpu"
        options = layout.options
        self.top_k = int(options["top_k"]) if options.get("top_k") is not None else None
        self.threshold = float(options["threshold"]) if options.get("threshold") is not None else None
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"options.top_k must be at least 1, got {self.top_k}")
        self.weights: np.ndarray | None = None
        self._cut: Any = None
        self._whole: Any = None
        self._tokenizer_bytes = 0

    def load(self, options: LoadOptions) -> None:
        settings = (options.backend, options.quantize, options.dtype, options.device, options.cuda_graphs)
        refused = refused_settings(*settings)
        if refused is not None:
            raise ModelUnavailable(
                f"{self.layout.root}: {refused.replace('static embedding', 'SparseStaticEmbedding')}"
            )
        from tokenizers import Tokenizer

        path = self.directory / "tokenizer.json"
        if not path.is_file():
            raise ModelUnavailable(f"{self.directory} holds a SparseStaticEmbedding module without {path.name}")
        self._tokenizer_bytes = path.stat().st_size
        self._cut, self._whole = Tokenizer.from_file(str(path)), Tokenizer.from_file(str(path))
        for tokenizer in (self._cut, self._whole):
            tokenizer.no_padding()
            tokenizer.no_truncation()
        # transformers' tokenizer called with truncation=True cuts at model_max_length, whatever
        # tokenizer.json says
        limit = self.layout.max_length or read_json(self.directory / "tokenizer_config.json").get("model_max_length")
        if isinstance(limit, int | float) and 0 < limit < _UNBOUNDED:
            self.max_length = int(limit)
            self._cut.enable_truncation(self.max_length)
        self.weights = self._read_weights(len(self._cut.get_vocab()))
        self.dimensions = int(self.weights.shape[0])
        self.dtype = str(self.weights.dtype)

    def _read_weights(self, vocabulary: int) -> np.ndarray:
        from safetensors import safe_open

        path = self.directory / "model.safetensors"
        if not path.is_file():
            raise ModelUnavailable(f"{self.directory} holds a SparseStaticEmbedding module without {path.name}")
        with safe_open(str(path), framework="numpy") as tensors:
            if "weight" not in tensors.keys():  # noqa: SIM118
                raise ModelUnavailable(f"{path} has no 'weight' tensor (the SparseStaticEmbedding table)")
            weights: np.ndarray = tensors.get_tensor("weight")
        if weights.ndim != 1 or weights.dtype.kind != "f" or len(weights) != vocabulary:
            raise ModelUnavailable(
                f"{path}: the table is {weights.dtype} of shape {weights.shape}, not one weight for each of the "
                f"tokenizer's {vocabulary} tokens"
            )
        return weights

    def unload(self) -> None:
        self.weights = None
        self._cut = self._whole = None

    def estimate(self, options: LoadOptions) -> int:
        files = (self.directory / name for name in ("model.safetensors", "tokenizer.json"))
        return sum(path.stat().st_size for path in files if path.is_file())

    def footprint(self) -> int:
        # the table, and the two tokenizers' parsed vocabularies (taken as four times their file each)
        return (self.weights.nbytes if self.weights is not None else 0) + 2 * 4 * self._tokenizer_bytes

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        assert self._cut is not None, "This is a bug: prepare() called before load()"
        checked = [self._check(i, item) for i, item in enumerate(items)]
        where = [i for i, item in enumerate(checked) if isinstance(item.content, Text)]
        encoded = dict(zip(where, encode_ids(self._cut, [self._text(checked[i]) for i in where]), strict=True))
        whole = [i for i in where if not checked[i].truncate] if self.max_length is not None else []
        for i, ids in zip(whole, encode_ids(self._whole, [self._text(checked[i]) for i in whole]), strict=True):
            if len(ids) > len(encoded[i]):
                raise InputTooLong(self._too_long(i, len(ids)), param="input")
        prepared = []
        for i, item in enumerate(checked):
            ids = encoded[i] if i in encoded else self._given(i, item)
            present = np.unique(np.asarray(ids, dtype=np.int64))
            prepared.append(Prepared(i, max(1, len(ids)), len(ids), present))
        return prepared

    def _check(self, index: int, item: Item) -> EmbedItem:
        item = embed_item(item, _SPARSE, "a SparseStaticEmbedding model")
        if not isinstance(item.content, Text | TokenIds):
            raise InvalidInput(f"input {index}: this model embeds text only", param="input")
        return item

    @staticmethod
    def _text(item: EmbedItem) -> str:
        assert isinstance(item.content, Text), "This is a bug: only texts are encoded"
        return item.prompt + item.content.text

    def _given(self, index: int, item: EmbedItem) -> list[int]:
        assert self.weights is not None, "This is a bug: prepare() called before load()"
        return given_ids(index, item, len(self.weights), self.max_length, self._too_long)

    def _too_long(self, index: int, tokens: int) -> str:
        return (
            f"input {index} has {tokens} tokens; the model reads at most {self.max_length} tokens; shorten it or "
            "allow truncation"
        )

    def collate(self, items: Sequence[Prepared]) -> list[np.ndarray]:
        return [p.data for p in items]

    def forward(self, batch: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        assert self.weights is not None, "This is a bug: forward() called before load()"
        return [self._kept(ids, self.weights[ids].astype(np.float32)) for ids in batch]

    def _kept(self, ids: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The non-zero weights (above `threshold`, the `top_k` largest where set), by token id."""
        keep = values != 0 if self.threshold is None else values > self.threshold
        ids, values = ids[keep], values[keep]
        if self.top_k is not None and len(ids) > self.top_k:
            order = np.sort(np.argsort(-values, kind="stable")[: self.top_k])
            ids, values = ids[order], values[order]
        return ids, values

    def postprocess(self, batch: list[np.ndarray], output: list[tuple[np.ndarray, np.ndarray]]) -> list[Result]:
        assert self._cut is not None, "This is a bug: postprocess() called before load()"
        token = self._cut.id_to_token
        return [
            Embedding(sparse=SparseVector(ids, values, tuple(token(int(i)) or "" for i in ids)))
            for ids, values in output
        ]

    def batch_cost(self, count: int, longest: int, total: int) -> int:
        return total  # nothing is padded: each token is one table entry read

    def describe(self) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "pooling": "token weights",
            "prompts": sorted(self.layout.prompts),
            "default_prompt_name": self.layout.default_prompt_name,
            "top_k": self.top_k,
            "threshold": self.threshold,
            "engine": {"backend": ENGINE, "reason": _WHY},
        }
        if self.weights is not None:
            facts["sparse_static"] = {"vocabulary": int(self.weights.shape[0]), "table_dtype": str(self.weights.dtype)}
        return {**facts, **self.layout.notes}
