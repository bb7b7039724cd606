"""ColBERT multi-vector embeddings on torch, for colbert-ai and PyLate checkpoints.

The method (Khattab and Zaharia, 2020, as colbert-ai implements it):
- a query is `[CLS] [Q] tokens [SEP]`, extended to `query_maxlen` with [MASK] tokens that the
  attention does not see (unless `attend_to_mask_tokens`); every position yields a vector;
- a document is `[CLS] [D] tokens [SEP]` cut to `doc_maxlen`; padding and, with
  `mask_punctuation`, punctuation tokens yield no vector;
- each token state goes through a bias-free linear projection and is L2-normalised;
- relevance is MaxSim: per query vector, the best dot product with a document vector, summed.

colbert-ai keeps its settings in `artifact.metadata` and the projection as `linear.weight` beside
the `bert.` encoder weights; PyLate uses the sentence-transformers layout with a Dense module and
keeps prefixes and lengths in `config_sentence_transformers.json`. A request asks for query
encoding with `prompt_name: query`.
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model_registry.adapters.base import LoadOptions
from model_registry.adapters.dense import TextEncoder, load_dense_layer
from model_registry.adapters.items import embed_item
from model_registry.backends.base import EncoderBatch
from model_registry.detect import DenseLayer, Layout, read_json
from model_registry.detect import _dense_layer as dense_layer
from model_registry.errors import InvalidInput, ModelUnavailable
from model_registry.types import Capability, Embedding, Item, Kind, Output, Prepared, Result, Text

_MULTIVECTOR = frozenset({Output.MULTIVECTOR})


@dataclass(frozen=True)
class ColbertSettings:
    dim: int | None
    query_maxlen: int
    doc_maxlen: int
    query_marker: str
    doc_marker: str
    query_expansion: bool
    attend_to_mask_tokens: bool
    skiplist: tuple[str, ...]


def colbert_settings(root: Path) -> ColbertSettings:
    """Settings from `artifact.metadata` (colbert-ai) or `config_sentence_transformers.json` (PyLate)."""
    if (root / "artifact.metadata").is_file():
        meta = json.loads((root / "artifact.metadata").read_text(encoding="utf-8"))
        return ColbertSettings(
            dim=int(meta.get("dim", 128)),
            query_maxlen=int(meta.get("query_maxlen", 32)),
            doc_maxlen=int(meta.get("doc_maxlen", 180)),
            query_marker=str(meta.get("query_token_id", "[unused0]")),
            doc_marker=str(meta.get("doc_token_id", "[unused1]")),
            query_expansion=True,
            attend_to_mask_tokens=bool(meta.get("attend_to_mask_tokens", False)),
            skiplist=tuple(string.punctuation) if meta.get("mask_punctuation", True) else (),
        )
    extra = read_json(root / "config_sentence_transformers.json")
    skiplist = extra.get("skiplist_words")
    return ColbertSettings(
        dim=None,
        query_maxlen=int(extra.get("query_length") or 32),
        doc_maxlen=int(extra.get("document_length") or 180),
        query_marker=str(extra.get("query_prefix", "[Q] ")).strip(),
        doc_marker=str(extra.get("document_prefix", "[D] ")).strip(),
        query_expansion=extra.get("do_query_expansion", True) is not False,
        attend_to_mask_tokens=bool(extra.get("attend_to_expansion_tokens", False)),
        skiplist=tuple(str(w) for w in skiplist) if isinstance(skiplist, list) else tuple(string.punctuation),
    )


@dataclass(frozen=True, slots=True)
class ColbertTokens:
    ids: tuple[int, ...]
    attended: int  # leading positions the attention sees
    keep: tuple[bool, ...]  # positions that yield a vector


@dataclass(frozen=True)
class ColbertBatch:
    inputs: EncoderBatch
    keep: torch.Tensor


def pylate_dense_layers(root: Path) -> tuple[DenseLayer, ...]:
    """PyLate names its projection `pylate.models.Dense.Dense`; it reads like sentence-transformers' Dense."""
    path = root / "modules.json"
    modules = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
    return tuple(
        dense_layer(root / str(m.get("path", "")))
        for m in modules
        if isinstance(m, dict) and str(m.get("type", "")).rsplit(".", 1)[-1] == "Dense"
    )


def _linear_from_checkpoint(root: Path) -> torch.Tensor:
    if (root / "model.safetensors").is_file():
        from safetensors import safe_open

        with safe_open(str(root / "model.safetensors"), framework="pt") as handle:
            if "linear.weight" in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                weight: torch.Tensor = handle.get_tensor("linear.weight")
                return weight
    elif (root / "pytorch_model.bin").is_file():
        state = torch.load(root / "pytorch_model.bin", map_location="cpu", weights_only=True)
        if "linear.weight" in state:
            found: torch.Tensor = state["linear.weight"]
            return found
    raise ModelUnavailable(f"no ColBERT projection 'linear.weight' in the checkpoint at {root}")


class ColbertAdapter(TextEncoder):
    #: Its projection runs over every token (not measured without the pool): it keeps torch's threads.
    small_heads = False
    kind = Kind.MULTIVECTOR
    capabilities = frozenset({Capability.MULTIVECTOR})
    truncation_sides = ("right",)  # ColBERT tokenizes with its markers itself
    token_caps = False  # its query and document lengths are its own settings

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        super().__init__(layout, trust_remote_code)
        self.settings = colbert_settings(layout.root)
        # Queries and documents are told apart by the prompt name, not by prompt text.
        self.prompts = {"query": "", "document": ""}
        self.projection: torch.nn.Module | None = None
        self.skip_ids: frozenset[int] = frozenset()

    def load(self, options: LoadOptions) -> None:
        self.load_model(options)
        layers = self.layout.dense_layers or pylate_dense_layers(self.layout.root)
        if layers:
            self.projection = torch.nn.Sequential(
                *(load_dense_layer(layer, self.head_device, self.head_dtype) for layer in layers)
            )
            self.dimensions = layers[-1].out_features
        else:
            weight = _linear_from_checkpoint(self.layout.root)
            linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
            linear.load_state_dict({"weight": weight})
            self.projection = linear.to(device=self.head_device, dtype=self.head_dtype).eval()
            self.dimensions = int(weight.shape[0])
        self.markers = (self._token_id(self.settings.query_marker), self._token_id(self.settings.doc_marker))
        assert self.tokenizer is not None
        skiplist = self.tokenizer.ids(list(self.settings.skiplist), special=False, cut=None)
        self.skip_ids = frozenset(ids[0] for ids in skiplist if ids)

    @property
    def hf(self) -> Any:
        assert self.tokenizer is not None, "This is a bug: the tokenizer is used before load()"
        return self.tokenizer.tokenizer

    def _token_id(self, token: str) -> int:
        found = self.hf.convert_tokens_to_ids(token)
        if found is None or found == self.hf.unk_token_id:
            raise ModelUnavailable(f"the ColBERT marker token '{token}' is not in the tokenizer's vocabulary")
        return int(found)

    def unload(self) -> None:
        self.projection = None
        super().unload()

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        embed_items = [embed_item(item, _MULTIVECTOR, "a ColBERT model") for item in items]
        for i, item in enumerate(embed_items):
            if not isinstance(item.content, Text):
                raise InvalidInput(f"input {i}: this model embeds text only", param="input")
        texts = [item.prompt + item.content.text for item in embed_items if isinstance(item.content, Text)]
        assert self.tokenizer is not None, "This is a bug: prepare() called before load()"
        encoded = self.tokenizer.ids(texts, special=False, cut=None)
        prepared = []
        for i, (item, ids) in enumerate(zip(embed_items, encoded, strict=True)):
            tokens = self._query(ids) if item.is_query else self._document(ids)
            prepared.append(Prepared(i, len(tokens.ids), tokens.attended, tokens, "query" if item.is_query else ""))
        return prepared

    def _query(self, ids: list[int]) -> ColbertTokens:
        s = self.settings
        real = [self.hf.cls_token_id, self.markers[0], *ids[: s.query_maxlen - 3], self.hf.sep_token_id]
        if not s.query_expansion:
            return ColbertTokens(tuple(real), len(real), (True,) * len(real))
        padded = real + [self.hf.mask_token_id] * (s.query_maxlen - len(real))
        attended = len(padded) if s.attend_to_mask_tokens else len(real)
        return ColbertTokens(tuple(padded), attended, (True,) * len(padded))

    def _document(self, ids: list[int]) -> ColbertTokens:
        s = self.settings
        full = [self.hf.cls_token_id, self.markers[1], *ids[: s.doc_maxlen - 3], self.hf.sep_token_id]
        return ColbertTokens(tuple(full), len(full), tuple(t not in self.skip_ids for t in full))

    def collate(self, items: Sequence[Prepared]) -> ColbertBatch:
        assert self.tokenizer is not None
        longest = max(len(p.data.ids) for p in items)
        ids = np.full((len(items), longest), self.tokenizer.pad_id, dtype=np.int64)
        attention = np.zeros((len(items), longest), dtype=np.int64)
        keep = np.zeros((len(items), longest), dtype=bool)
        for row, p in enumerate(items):
            tokens: ColbertTokens = p.data
            ids[row, : len(tokens.ids)] = tokens.ids
            attention[row, : tokens.attended] = 1
            keep[row, : len(tokens.keep)] = tokens.keep
        return ColbertBatch(EncoderBatch(ids, attention), torch.from_numpy(keep))

    def forward(self, batch: ColbertBatch) -> torch.Tensor:
        assert self.projection is not None
        output = self.run(batch.inputs)
        with torch.inference_mode():
            states = self.states(output)
            vectors = self.projection(states).float()
            normalised: torch.Tensor = torch.nn.functional.normalize(vectors, p=2, dim=-1).cpu()
            return normalised

    def postprocess(self, batch: ColbertBatch, output: torch.Tensor) -> list[Result]:
        array = output.numpy()
        keep = batch.keep.numpy()
        return [Embedding(multivector=np.ascontiguousarray(array[row][keep[row]])) for row in range(len(array))]

    def family_facts(self) -> dict[str, Any]:
        s = self.settings
        return {"query_maxlen": s.query_maxlen, "doc_maxlen": s.doc_maxlen, "dim": self.dimensions}
