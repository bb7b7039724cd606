"""Two-tower models on torch: a text tower and a media tower projecting into one shared space.

CLIP/SigLIP (image) and CLAP (audio) share everything but how a media item is decoded, priced and
encoded. Text and media items carry different `Prepared.group`s, so a batch feeds one tower only.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.adapters.text import pad
from model_registry.backends.torch import engine as backend
from model_registry.backends.weights import from_pretrained_checked
from model_registry.detection.layout import Layout
from model_registry.errors import InvalidInput, UnsupportedOperation
from model_registry.media.decoding import media_of
from model_registry.types import (
    Embedding,
    EmbedItem,
    Item,
    Media,
    MediaLimits,
    Modality,
    Output,
    Prepared,
    Result,
    Text,
)

TEXT = "text"


def tower_text(index: int, item: Item) -> str:
    """The text of a text-tower item (prompt included); dense output only, no token ids."""
    assert isinstance(item, EmbedItem), "This is a bug: media_of lets only EmbedItem through"
    if item.outputs - {Output.DENSE}:
        raise UnsupportedOperation("this model produces dense vectors only", param="outputs")
    if not isinstance(item.content, Text):
        raise InvalidInput(f"input {index}: this model takes text, not token ids", param="input")
    return item.prompt + item.content.text


@dataclass(frozen=True)
class TowerBatch:
    group: str
    tensors: dict[str, torch.Tensor]


def features(output: Any) -> torch.Tensor:
    """`get_*_features` return a tensor in transformers 4 and an output object in 5."""
    if isinstance(output, torch.Tensor):
        return output
    pooled: torch.Tensor = output.pooler_output
    return pooled


class TwoTowerAdapter(Adapter):
    """Subclasses set `modality` and implement `load_parts`, `prepare_media`, `collate_media`, `media_features`."""

    backend = "torch"
    modality: Modality
    #: Pad every text to the longest the model takes, as SigLIP's processors do (its text tower pools
    #: the last position, padding or not).
    pad_to_max_length = False
    #: Position ids that the text tower reserves before the first token (RoBERTa-style towers: 2).
    position_offset = 0
    #: Whether an image's patches count as the tokens a request reads (its usage): a tower that reads
    #: an image as a sequence of its own length (SigLIP 2 NaFlex); a fixed-size tower's do not.
    visual_tokens = False

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        self.layout = layout
        self.trust_remote_code = trust_remote_code
        self.model: Any = None
        self.tokenizer: Any = None
        self.device = "cpu"
        self.dtype = torch.float32
        self.limits = MediaLimits()
        self._footprint = 0

    # ---- loading ---------------------------------------------------------------------------------

    def load(self, options: LoadOptions) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.device = backend.resolve_device(options.device)
        self.dtype = backend.resolve_dtype(options.dtype, self.device)
        backend.configure_threads(options.threads)
        self.limits = options.media
        directory = str(self.layout.root)
        self.tokenizer = AutoTokenizer.from_pretrained(directory)
        model = from_pretrained_checked(
            AutoModel, self.layout.root, "two towers", dtype=self.dtype, trust_remote_code=self.trust_remote_code
        )
        self.model = model.to(self.device).eval()
        self.load_parts(directory)
        text_config = getattr(self.model.config, "text_config", self.model.config)
        positions = getattr(text_config, "max_position_embeddings", None)
        limits = [
            self.layout.max_length,
            positions - self.position_offset if isinstance(positions, int) else None,
            getattr(self.tokenizer, "model_max_length", None),
        ]
        usable = [n for n in limits if isinstance(n, int) and 0 < n < 1_000_000]
        self.max_length = min(usable) if usable else 77
        # The wrapper sets its Rust tokenizer's truncation at the first call, which must not race a
        # prepare thread's encoding; every later call asks for the same and leaves it alone.
        self._tokenize(["a"])
        # CLIP and CLAP name their shared width `projection_dim`; SigLIP projects to the text width.
        projection = getattr(self.model.config, "projection_dim", None)
        projection = projection or getattr(text_config, "projection_size", None)
        self.dimensions = int(projection) if projection else None
        self._footprint = backend.module_bytes(self.model) * 2

    @abc.abstractmethod
    def load_parts(self, directory: str) -> None:
        """Load the media preprocessor (image processor, feature extractor) from the directory."""

    def unload(self) -> None:
        self.model = None
        self.tokenizer = None

    def footprint(self) -> int:
        return self._footprint

    # ---- prepare ---------------------------------------------------------------------------------

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        medias = [media_of(i, item, frozenset({self.modality})) for i, item in enumerate(items)]
        texts = [i for i, m in enumerate(medias) if m is None]
        prepared: dict[int, Prepared] = {}
        for index, ids in zip(texts, self._tokenize([tower_text(i, items[i]) for i in texts]), strict=True):
            prepared[index] = Prepared(index, len(ids), len(ids), ids, TEXT)
        for index, media in enumerate(medias):
            if media is not None:
                data, cost = self.prepare_media(media, index)
                read = cost if self.visual_tokens else 0
                prepared[index] = Prepared(index, cost, read, data, self.modality.value)
        return [prepared[i] for i in range(len(items))]

    def _tokenize(self, texts: list[str]) -> list[tuple[int, ...]]:
        if not texts:
            return []
        encoded = self.tokenizer(texts, truncation=True, max_length=self.max_length, return_attention_mask=False)
        return [tuple(ids) for ids in encoded["input_ids"]]

    @abc.abstractmethod
    def prepare_media(self, media: Media, index: int) -> tuple[Any, int]:
        """Decode and preprocess one media item: (its model inputs, its cost in patches or frames)."""

    # ---- batches ---------------------------------------------------------------------------------

    def collate(self, items: Sequence[Prepared]) -> TowerBatch:
        group = items[0].group
        if group != TEXT:
            return TowerBatch(group, {k: v.to(self.device) for k, v in self.collate_media(items).items()})
        pad_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0)
        left = self.tokenizer.padding_side == "left"
        padded = pad([p.data for p in items], pad_id, left=left)
        ids, mask = padded.input_ids, padded.attention_mask
        extra = self.max_length - ids.shape[1] if self.pad_to_max_length else 0
        if extra > 0:
            widths = ((0, 0), (extra, 0) if left else (0, extra))
            ids, mask = np.pad(ids, widths, constant_values=pad_id), np.pad(mask, widths)
        tensors = {"input_ids": torch.from_numpy(ids)}
        # The tower gets the mask wherever the tokenizer gives one, as the processor's output feeds
        # `get_text_features` in transformers (SigLIP's text tower applies it to its padding too).
        if "attention_mask" in self.tokenizer.model_input_names:
            tensors["attention_mask"] = torch.from_numpy(mask)
        return TowerBatch(TEXT, {k: v.to(self.device) for k, v in tensors.items()})

    @abc.abstractmethod
    def collate_media(self, items: Sequence[Prepared]) -> dict[str, torch.Tensor]:
        """Stack prepared media items into the media tower's keyword arguments."""

    def forward(self, batch: TowerBatch) -> torch.Tensor:
        with torch.inference_mode():
            if batch.group == TEXT:
                vectors = features(self.model.get_text_features(**batch.tensors))
            else:
                vectors = self.media_features(batch.tensors)
            return vectors.float().cpu()

    @abc.abstractmethod
    def media_features(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """The media tower's projected vectors for a collated batch."""

    def postprocess(self, batch: TowerBatch, output: torch.Tensor) -> list[Result]:
        array = np.ascontiguousarray(output.numpy(), dtype=np.float32)
        return [Embedding(dense=row) for row in array]

    def describe(self) -> dict[str, Any]:
        return {"modalities": ["text", self.modality.value], "model_type": self.layout.model_type, **self.layout.notes}
