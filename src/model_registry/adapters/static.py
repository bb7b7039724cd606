"""Static embeddings: a token's vector is a row of a table, a text's vector the mean of its tokens'.

Two published layouts, each computed as its own library computes it, on numpy and tokenizers alone
(no torch, no transformers, no engine):

- model2vec (config.json `model_type: model2vec`; `embeddings`, and optionally per-token `weights`
  and a `mapping` from token ids to rows, in model.safetensors), as `StaticModel.encode` (model2vec
  0.10): a text is cut to `max_length` times the median length of the vocabulary's tokens in
  characters, tokenized without special tokens and cut to `max_length` tokens, its unknown tokens
  then dropped; a token's vector is `embeddings[mapping[id]] * weights[id]`; the mean is taken in
  the table's precision (float32 for an int8 table), then L2-normalised where `normalize` says.
- sentence-transformers' StaticEmbedding (`embedding.weight`, or model2vec's tensors folded into one
  row per token as the module folds them), as `SentenceTransformer.encode`: the tokenizer as saved
  (its own truncation, if any), no special tokens, unknown tokens kept, an EmbeddingBag mean, then
  the Normalize module where the pipeline has one and `truncate_dim`.

A text with no token left is the zero vector, as both libraries answer it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.adapters.items import embed_item
from model_registry.detection.layout import Layout
from model_registry.errors import InputTooLong, InvalidInput, ModelUnavailable
from model_registry.types import Capability, Embedding, EmbedItem, Item, Kind, Output, Prepared, Result, Text, TokenIds

#: What `/models` says runs a static model, in place of an engine.
ENGINE = "numpy"
_WHY = "a static embedding model: a table lookup and a mean on numpy, run by no engine"
#: The tensor names of model2vec's model.safetensors.
_EMBEDDINGS, _WEIGHTS, _MAPPING = "embeddings", "weights", "mapping"
_DENSE = frozenset({Output.DENSE})


def refused_settings(backend: str, quantize: str, dtype: str, device: str, cuda_graphs: object = "auto") -> str | None:
    """What of a model entry's engine settings a static model cannot honour, said as a fix (None:
    nothing): it runs on numpy on the CPU, in its table's own precision."""
    asked = [
        f"{key}: {value}"
        for key, value, fine in (
            ("backend", backend, backend == "auto"),
            ("quantize", quantize, quantize == "none"),
            ("dtype", dtype, dtype == "auto"),
            ("device", device, device in ("auto", "cpu")),
            ("cuda_graphs", cuda_graphs, cuda_graphs is not True),
        )
        if not fine
    ]
    if not asked:
        return None
    return (
        f"{', '.join(asked)} does not apply to a static embedding model: it runs on numpy, on the CPU, in its "
        "table's own precision, without an engine; remove the key (no backend key serves it)"
    )


@dataclass(frozen=True)
class Table:
    """A static model's weights: one row per token id (or per `mapping[id]`), and the optional
    per-token weights."""

    rows: np.ndarray
    weights: np.ndarray | None = None
    mapping: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.rows, self.weights, self.mapping) if a is not None)


class StaticAdapter(Adapter):
    kind = Kind.DENSE
    capabilities = frozenset({Capability.EMBED_TEXT})
    backend = ENGINE
    computes_inline = True

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        self.layout = layout
        self.model2vec = layout.model_type == "model2vec"
        self.prompts = dict(layout.prompts)
        self.default_prompt_name = layout.default_prompt_name
        self.similarity = layout.similarity
        self.max_length = layout.max_length
        self.device = "cpu"
        self.table: Table | None = None
        #: Encodes as the reference does (cut where it cuts), and whole (to tell a text it would cut).
        self._cut: Any = None
        self._whole: Any = None
        self._unknown: int | None = None
        #: model2vec's character cut: `max_length` times the vocabulary's median token length.
        self._chars: int | None = None
        self._vocabulary = 0
        self._tokenizer_bytes = 0

    # ---- loading -------------------------------------------------------------------------------

    def load(self, options: LoadOptions) -> None:
        settings = (options.backend, options.quantize, options.dtype, options.device, options.cuda_graphs)
        refused = refused_settings(*settings)
        if refused is not None:
            raise ModelUnavailable(f"{self.layout.root}: {refused}")
        from tokenizers import Tokenizer

        path = self.layout.transformer_dir / "tokenizer.json"
        if not path.is_file():
            raise ModelUnavailable(f"{self.layout.root} holds a static embedding model without {path.name}")
        self._tokenizer_bytes = path.stat().st_size
        self._cut, self._whole = Tokenizer.from_file(str(path)), Tokenizer.from_file(str(path))
        for tokenizer in (self._cut, self._whole):
            tokenizer.no_padding()
        self._whole.no_truncation()
        vocabulary = self._cut.get_vocab()
        self._vocabulary = max(vocabulary.values(), default=-1) + 1
        if self.model2vec:
            self._set_model2vec_cut(vocabulary)
        elif self.layout.max_length is not None:
            self._cut.enable_truncation(self.layout.max_length)
        truncation = self._cut.truncation
        self.max_length = None if truncation is None else int(truncation["max_length"])
        self.table = self._read_table(self.layout.transformer_dir / "model.safetensors", len(vocabulary))
        self.dimensions = int(self.table.rows.shape[1])
        if self.layout.truncate_dim is not None:
            self.dimensions = min(self.dimensions, self.layout.truncate_dim)
        self.dtype = str(self._out_dtype)

    def _set_model2vec_cut(self, vocabulary: dict[str, int]) -> None:
        """model2vec's cut at `max_length` tokens and its characters; the unknown token it drops."""
        limit = self.layout.max_length
        if limit is None:
            self._cut.no_truncation()
        else:
            self._cut.enable_truncation(limit)
            self._chars = limit * int(np.median([len(token) for token in vocabulary]))
        self._unknown = _unknown_id(self._cut)

    def _read_table(self, path: Path, vocabulary: int) -> Table:
        from safetensors import safe_open

        if not path.is_file():
            raise ModelUnavailable(f"{self.layout.root} holds a static embedding model without {path.name}")
        with safe_open(str(path), framework="numpy") as weights:
            tensors = {name: weights.get_tensor(name) for name in weights.keys()}  # noqa: SIM118
        if "embedding.weight" in tensors:
            table = Table(tensors["embedding.weight"])
        elif _EMBEDDINGS in tensors:
            table = Table(tensors[_EMBEDDINGS], tensors.get(_WEIGHTS), tensors.get(_MAPPING))
        else:
            raise ModelUnavailable(f"{path} holds neither 'embedding.weight' nor model2vec's 'embeddings'")
        self._check_table(path, table, vocabulary)
        if self.model2vec or (table.weights is None and table.mapping is None):
            return table
        return Table(_folded(table))  # as sentence-transformers loads model2vec's tensors: a row per token

    def _check_table(self, path: Path, table: Table, vocabulary: int) -> None:
        rows = table.rows
        if rows.ndim != 2 or rows.dtype.kind not in "fi":
            raise ModelUnavailable(f"{path}: the table is {rows.dtype} of shape {rows.shape}, not a matrix of numbers")
        if self.model2vec and table.mapping is None and len(rows) != vocabulary:
            # model2vec refuses such a model, naming the same two counts
            raise ModelUnavailable(
                f"{path}: {len(rows)} vectors for the tokenizer's {vocabulary} tokens, and no token mapping"
            )
        reach = len(rows) if table.mapping is None else len(table.mapping)
        for name, array in ((_WEIGHTS, table.weights), (_MAPPING, table.mapping)):
            if array is not None and (array.ndim != 1 or len(array) < self._vocabulary):
                raise ModelUnavailable(f"{path}: '{name}' has {array.shape} entries for {self._vocabulary} token ids")
        if table.mapping is not None and (table.mapping.dtype.kind not in "iu" or table.mapping.max() >= len(rows)):
            raise ModelUnavailable(f"{path}: 'mapping' points outside the {len(rows)} vectors")
        if reach < self._vocabulary:
            raise ModelUnavailable(f"{path}: {reach} vectors for token ids up to {self._vocabulary - 1}")

    @property
    def _out_dtype(self) -> np.dtype[Any]:
        """The precision the reference answers in: the table's, float32 for an int8 one."""
        assert self.table is not None, "This is a bug: the table is read at load"
        dtype = self.table.rows.dtype
        return np.dtype(np.float32) if dtype.kind == "i" else dtype

    def unload(self) -> None:
        self.table = None
        self._cut = self._whole = None

    def estimate(self, options: LoadOptions) -> int:
        files = (self.layout.transformer_dir / name for name in ("model.safetensors", "tokenizer.json"))
        return sum(path.stat().st_size for path in files if path.is_file())

    def footprint(self) -> int:
        # the table, and the two tokenizers' parsed vocabularies (taken as four times their file each)
        return (self.table.nbytes if self.table is not None else 0) + 2 * 4 * self._tokenizer_bytes

    # ---- serving -------------------------------------------------------------------------------

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        assert self._cut is not None, "This is a bug: prepare() called before load()"
        checked = [self._check(i, item) for i, item in enumerate(items)]
        where = [i for i, item in enumerate(checked) if isinstance(item.content, Text)]
        texts = [self._text(checked[i]) for i in where]
        encoded = dict(zip(where, encode_ids(self._cut, texts), strict=True))
        # A text the reference would cut, asked whole: refused (the cut and whole encodings differ).
        whole = [i for i in where if not checked[i].truncate] if self.max_length is not None else []
        for i, ids in zip(
            whole, encode_ids(self._whole, [self._text(checked[i], cut=False) for i in whole]), strict=True
        ):
            if ids != encoded[i]:
                raise InputTooLong(self._too_long(i, len(ids)), param="input")
        prepared = []
        for i, item in enumerate(checked):
            ids = encoded[i] if i in encoded else self._given(i, item)
            pooled = np.asarray([t for t in ids if t != self._unknown], dtype=np.int64)
            prepared.append(Prepared(i, max(1, len(ids)), len(ids), pooled))
        return prepared

    def _check(self, index: int, item: Item) -> EmbedItem:
        item = embed_item(item, _DENSE, "a static embedding model")
        if not isinstance(item.content, Text | TokenIds):
            raise InvalidInput(f"input {index}: this model embeds text only", param="input")
        return item

    def _text(self, item: EmbedItem, *, cut: bool = True) -> str:
        assert isinstance(item.content, Text), "This is a bug: only texts are encoded"
        text = item.prompt + item.content.text
        return text[: self._chars] if cut and self._chars is not None else text

    def _given(self, index: int, item: EmbedItem) -> list[int]:
        """Client-given token ids: the sequence as it is (no special tokens are added here either)."""
        return given_ids(index, item, self._vocabulary, self.max_length, self._too_long)

    def _too_long(self, index: int, tokens: int) -> str:
        chars = f" and its first {self._chars:,} characters (model2vec's cut)" if self._chars is not None else ""
        return (
            f"input {index} has {tokens} tokens; the model reads at most {self.max_length} tokens{chars}; shorten it "
            "or allow truncation"
        )

    def collate(self, items: Sequence[Prepared]) -> list[np.ndarray]:
        return [p.data for p in items]

    def forward(self, batch: list[np.ndarray]) -> np.ndarray:
        assert self.table is not None, "This is a bug: forward() called before load()"
        vectors = _means(self.table, batch, self._out_dtype)
        if self.layout.normalize:
            vectors = _model2vec_normalized(vectors) if self.model2vec else normalized(vectors)
        if self.layout.truncate_dim is not None:  # cut after the Normalize module, as saved: not renormalised
            vectors = vectors[:, : self.layout.truncate_dim]
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def postprocess(self, batch: list[np.ndarray], output: np.ndarray) -> list[Result]:
        return [Embedding(dense=row) for row in output]

    def batch_cost(self, count: int, longest: int, total: int) -> int:
        return total  # nothing is padded: each token is one row read

    def describe(self) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "pooling": "mean",
            "normalize": self.layout.normalize,
            "prompts": sorted(self.layout.prompts),
            "default_prompt_name": self.layout.default_prompt_name,
            "similarity_fn_name": self.similarity.value,
            "engine": {"backend": ENGINE, "reason": _WHY},
        }
        if self.table is not None:
            facts["static"] = {
                "layout": "model2vec" if self.model2vec else "sentence-transformers StaticEmbedding",
                "vectors": list(self.table.rows.shape),
                "table_dtype": str(self.table.rows.dtype),
                "token_weights": self.table.weights is not None,
                "token_mapping": self.table.mapping is not None,
                "unknown_tokens": "dropped" if self._unknown is not None else "kept",
                "max_characters": self._chars,
            }
        return {**facts, **self.layout.notes}


def given_ids(
    index: int, item: EmbedItem, vocabulary: int, max_length: int | None, too_long: Callable[[int, int], str]
) -> list[int]:
    """Input `index`'s client-given token ids, each checked against the vocabulary, cut at
    `max_length` where the item allows truncation (else `too_long`'s message, a 400)."""
    assert isinstance(item.content, TokenIds), "This is a bug: a text reached the token-id path"
    ids = list(item.content.ids)
    bad = next((t for t in ids if not 0 <= t < vocabulary), None)
    if bad is not None:
        raise InvalidInput(f"input {index} has token id {bad}, outside the vocabulary [0, {vocabulary})", param="input")
    if max_length is not None and len(ids) > max_length:
        if not item.truncate:
            raise InputTooLong(too_long(index, len(ids)), param="input")
        ids = ids[:max_length]
    return ids


def encode_ids(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    if not texts:  # the Rust tokenizer refuses an empty batch
        return []
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # no offsets: the same ids, sooner
    return [list(e.ids) for e in encode(texts, add_special_tokens=False)]


def _unknown_id(tokenizer: Any) -> int | None:
    """The token model2vec drops from every text: the model's `unk_token` (WordPiece, BPE,
    WordLevel), or a Unigram model's `unk_id`."""
    model = tokenizer.model
    if hasattr(model, "unk_token"):
        token = model.unk_token
        return None if token is None else tokenizer.token_to_id(token)
    found = json.loads(tokenizer.to_str())["model"].get("unk_id")
    return None if found is None else int(found)


def _folded(table: Table) -> np.ndarray:
    """model2vec's tensors as sentence-transformers' StaticEmbedding loads them: one row per token
    id, `embeddings[mapping[id]] * weights[id]`, weighted in float32 or wider."""
    rows = table.rows if table.mapping is None else table.rows[table.mapping]
    if table.weights is None:
        return rows
    wide = np.promote_types(rows.dtype, np.float32)
    weighted: np.ndarray = rows.astype(wide) * table.weights.astype(wide)[:, None]
    return weighted


def _means(table: Table, batch: Sequence[np.ndarray], dtype: np.dtype[Any]) -> np.ndarray:
    """Each item's mean of its tokens' vectors, a row of zeros for an item with none, summed in
    the order and precision numpy's `mean` sums the reference's rows (the table's own, float32 for
    float16, float64 for integers), the result in `dtype`."""
    out = np.zeros((len(batch), table.rows.shape[1]), dtype=dtype)
    filled = [i for i, ids in enumerate(batch) if len(ids)]
    if not filled:
        return out
    ids = np.concatenate([batch[i] for i in filled])
    vectors = table.rows[ids if table.mapping is None else table.mapping[ids]]
    if table.weights is not None:
        vectors = vectors * table.weights[ids][:, None]
    counts = np.asarray([len(batch[i]) for i in filled])
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    sums = np.add.reduceat(vectors, starts, axis=0, dtype=_summed(vectors.dtype))
    out[filled] = sums / counts[:, None].astype(sums.dtype)
    return out


def _summed(dtype: np.dtype[Any]) -> np.dtype[Any]:
    if dtype.kind in "iub":
        return np.dtype(np.float64)
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def _model2vec_normalized(vectors: np.ndarray) -> np.ndarray:
    """model2vec's normalisation: in float32, by the norm plus 1e-32, back in the output's precision."""
    wide = vectors.astype(np.float32)
    unit: np.ndarray = wide / (np.linalg.norm(wide, axis=1, keepdims=True) + 1e-32)
    return unit.astype(vectors.dtype)


def normalized(vectors: np.ndarray) -> np.ndarray:
    """sentence-transformers' Normalize (torch's `normalize`: the norm at least 1e-12)."""
    unit: np.ndarray = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return unit
