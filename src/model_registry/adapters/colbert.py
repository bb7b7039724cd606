"""ColBERT multi-vector embeddings on torch, for colbert-ai and PyLate checkpoints.

The method (Khattab and Zaharia, 2020), as PyLate computes it:
- a text is tokenized with the tokenizer's own special tokens and cut to its length less one,
  then the prefix token goes after the first token: `[CLS] [Q] tokens [SEP]` for a query,
  `[CLS] [D] tokens [SEP]` for a document (an empty prefix inserts nothing and cuts to the length);
- with query expansion, a query is padded to `query_length` with [MASK] (else EOS, else the pad
  token); the attention sees the expansion tokens only with `attend_to_expansion_tokens`, but each
  of them yields a vector; without expansion a query keeps its real tokens only;
- a document's skiplist tokens (punctuation by default) yield no vector; they are still encoded;
- each token state goes through the bias-free projection (PyLate's Dense, or colbert-ai's
  `linear.weight`) and is L2-normalised;
- relevance is MaxSim: per query vector, the best dot product with a document vector, summed.

colbert-ai keeps its settings in `artifact.metadata` and the projection as `linear.weight` beside
the `bert.` encoder weights; PyLate uses the sentence-transformers layout with a Dense module and
keeps prefixes, lengths, expansion and skiplist in `config_sentence_transformers.json`. PyLate adds
its prefixes to the tokenizer ("[Q] " with its space, GTE-ModernColBERT); a tokenizer that lacks the
prefix but has it without the space ("[Q]") uses that token. A request asks for query encoding
with `prompt_name: query`.
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

from model_registry.adapters import segments
from model_registry.adapters.base import LoadOptions
from model_registry.adapters.dense import TextEncoder, load_dense_layer
from model_registry.adapters.items import embed_item
from model_registry.adapters.segments import Ragged
from model_registry.backends.base import EncoderBatch
from model_registry.detection.layout import DenseLayer, Layout, read_json
from model_registry.detection.layout import _dense_layer as dense_layer
from model_registry.errors import InvalidInput, ModelUnavailable
from model_registry.types import Capability, Embedding, Item, Kind, Output, Prepared, Result, Text

_MULTIVECTOR = frozenset({Output.MULTIVECTOR})


@dataclass(frozen=True)
class ColbertSettings:
    dim: int | None
    query_maxlen: int
    doc_maxlen: int
    query_marker: str  # "" inserts no prefix token
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
    expansion = extra.get("do_query_expansion", True) is not False
    query_prefix, document_prefix = extra.get("query_prefix"), extra.get("document_prefix")
    return ColbertSettings(
        dim=None,
        query_maxlen=int(extra.get("query_length") or 32),
        doc_maxlen=int(extra.get("document_length") or 180),
        query_marker="[Q] " if query_prefix is None else str(query_prefix),
        doc_marker="[D] " if document_prefix is None else str(document_prefix),
        query_expansion=expansion,
        # PyLate attends to expansion tokens only when there are some.
        attend_to_mask_tokens=expansion and bool(extra.get("attend_to_expansion_tokens", False)),
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
        self.markers: tuple[int | None, int | None] = (None, None)
        self.expansion_id = 0
        self.trailing = 1

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
        self.markers = (self._marker(self.settings.query_marker), self._marker(self.settings.doc_marker))
        self.expansion_id = self._expansion_id()
        self.trailing = self._trailing_specials()
        self.skip_ids = frozenset(self._skip_ids(self.settings.skiplist))

    @property
    def hf(self) -> Any:
        assert self.tokenizer is not None, "This is a bug: the tokenizer is used before load()"
        return self.tokenizer.tokenizer

    def _known(self, token: str) -> int | None:
        found = self.hf.convert_tokens_to_ids(token)
        return None if found is None or (found == self.hf.unk_token_id and token != self.hf.unk_token) else int(found)

    def _marker(self, prefix: str) -> int | None:
        """The prefix's token: as written ("[Q] ", an added token), else without its spaces ("[Q]")."""
        if prefix == "":
            return None
        found = self._known(prefix)
        found = found if found is not None else self._known(prefix.strip())
        if found is None:
            raise ModelUnavailable(
                f"the ColBERT prefix {prefix!r} is not a token of this tokenizer (nor {prefix.strip()!r}): "
                "PyLate adds its prefixes to the tokenizer when it trains a model, and this checkpoint's "
                "tokenizer lacks them"
            )
        return found

    def _expansion_id(self) -> int:
        """PyLate pads queries with [MASK], or EOS where a model has no mask token, else its pad token."""
        for candidate in (self.hf.mask_token_id, self.hf.eos_token_id, self.hf.pad_token_id):
            if candidate is not None:
                return int(candidate)
        raise ModelUnavailable("this ColBERT model's tokenizer has no [MASK], EOS or pad token to expand queries with")

    def _trailing_specials(self) -> int:
        """Special tokens the tokenizer puts after a text ([SEP]: 1), kept when a text is cut."""
        assert self.tokenizer is not None
        plain = self.tokenizer.ids(["a b c"], special=False, cut=None)[0]
        full = self.tokenizer.ids(["a b c"], cut=None)[0]
        leading = next((k for k in range(len(full)) if full[k : k + len(plain)] == plain), 0)
        return len(full) - leading - len(plain)

    def _skip_ids(self, words: Sequence[str]) -> list[int]:
        """Skiplist words as PyLate resolves them, each as one token: a word the vocabulary lacks is the
        unknown token, so that a document's unknown tokens yield no vector either."""
        ids = [self.hf.convert_tokens_to_ids(word) for word in words]
        return [int(i) for i in ids if i is not None]

    def unload(self) -> None:
        self.projection = None
        super().unload()

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        embed_items = [embed_item(item, _MULTIVECTOR, "a ColBERT model") for item in items]
        for i, item in enumerate(embed_items):
            if not isinstance(item.content, Text):
                raise InvalidInput(f"input {i}: this model embeds text only", param="input")
        texts = [item.prompt + item.content.text for item in embed_items if isinstance(item.content, Text)]
        if self.layout.do_lower_case:
            texts = [text.lower() for text in texts]
        assert self.tokenizer is not None, "This is a bug: prepare() called before load()"
        encoded = self.tokenizer.ids(texts, cut=None)
        prepared = []
        for i, (item, ids) in enumerate(zip(embed_items, encoded, strict=True)):
            tokens = self._query(ids) if item.is_query else self._document(ids)
            prepared.append(Prepared(i, len(tokens.ids), tokens.attended, tokens, "query" if item.is_query else ""))
        return prepared

    def _framed(self, ids: list[int], length: int, marker: int | None) -> list[int]:
        """`ids` (special tokens included) cut to `length` with the marker after the first token."""
        room = length - (marker is not None)
        if len(ids) > room:
            ids = ids[: room - self.trailing] + ids[len(ids) - self.trailing :]
        return ids if marker is None else [*ids[:1], marker, *ids[1:]]

    def _query(self, ids: list[int]) -> ColbertTokens:
        s = self.settings
        real = self._framed(ids, s.query_maxlen, self.markers[0])
        if not s.query_expansion:
            return ColbertTokens(tuple(real), len(real), (True,) * len(real))
        padded = real + [self.expansion_id] * (s.query_maxlen - len(real))
        attended = len(padded) if s.attend_to_mask_tokens else len(real)
        return ColbertTokens(tuple(padded), attended, (True,) * len(padded))

    def _document(self, ids: list[int]) -> ColbertTokens:
        full = self._framed(ids, self.settings.doc_maxlen, self.markers[1])
        return ColbertTokens(tuple(full), len(full), tuple(t not in self.skip_ids for t in full))

    def collate(self, items: Sequence[Prepared]) -> ColbertBatch:
        assert self.tokenizer is not None
        longest = max(len(p.data.ids) for p in items)
        ids = np.full((len(items), longest), self.tokenizer.pad_id, dtype=np.int64)
        attention = np.zeros((len(items), longest), dtype=np.int64)
        outputs = np.zeros((len(items), longest), dtype=np.int64)
        keep = np.zeros((len(items), longest), dtype=bool)
        for row, p in enumerate(items):
            tokens: ColbertTokens = p.data
            ids[row, : len(tokens.ids)] = tokens.ids
            attention[row, : tokens.attended] = 1
            outputs[row, : len(tokens.ids)] = 1
            keep[row, : len(tokens.keep)] = tokens.keep
        # Query expansion tokens that the attention does not see still yield vectors.
        expanded = outputs if any(p.data.attended < len(p.data.ids) for p in items) else None
        return ColbertBatch(EncoderBatch(ids, attention, output_mask=expanded), torch.from_numpy(keep))

    def forward(self, batch: ColbertBatch) -> Ragged:
        """The kept tokens' vectors, row after row, from padded or packed states alike."""
        assert self.projection is not None
        output = self.run(batch.inputs)
        with torch.inference_mode():
            states = segments.select(self.states(output), batch.keep, output.packed)
            vectors = torch.nn.functional.normalize(self.projection(states).float(), p=2, dim=-1).cpu()
            return Ragged(vectors, tuple(batch.keep.sum(dim=1).tolist()))

    def postprocess(self, batch: ColbertBatch, output: Ragged) -> list[Result]:
        return [Embedding(multivector=row) for row in output.rows()]

    def family_facts(self) -> dict[str, Any]:
        s = self.settings
        return {"query_maxlen": s.query_maxlen, "doc_maxlen": s.doc_maxlen, "dim": self.dimensions}
