"""ColPali and ColQwen2 through transformers: page images and text queries to multi-vectors.

The model's own processor builds the inputs (the image prompt and its image tokens; the query
prefix and augmentation tokens), one item at a time in `prepare`; `collate` pads them. A page
costs its sequence length (image tokens included), a query its tokens. Output rows are
L2-normalised by the model; padding rows are dropped, so MaxSim sees real tokens only. There is
no single-vector output: a request must ask for `multivector`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.adapters.text import pad
from model_registry.backends import torch as backend
from model_registry.detect import Layout
from model_registry.errors import InvalidInput, UnsupportedOperation
from model_registry.media import MediaLimits, decode_image, media_of, processing
from model_registry.types import Capability, Embedding, EmbedItem, Item, Kind, Modality, Output, Prepared, Result, Text

_CLASSES = {"ColPaliForRetrieval": "ColPaliForRetrieval", "ColQwen2ForRetrieval": "ColQwen2ForRetrieval"}


@dataclass(frozen=True)
class PageBatch:
    tensors: dict[str, torch.Tensor]
    mask: torch.Tensor


class ColPaliAdapter(Adapter):
    kind = Kind.PAGE_TEXT
    capabilities = frozenset({Capability.EMBED_TEXT, Capability.EMBED_IMAGE, Capability.MULTIVECTOR})
    backend = "torch"

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        self.layout = layout
        self.trust_remote_code = trust_remote_code
        self.model: Any = None
        self.processor: Any = None
        self.device = "cpu"
        self.dtype = torch.float32
        self.limits = MediaLimits()
        self._footprint = 0

    def load(self, options: LoadOptions) -> None:
        import transformers

        name = next((a for a in self.layout.architectures if a in _CLASSES), "ColPaliForRetrieval")
        model_class = getattr(transformers, _CLASSES[name])
        self.device = backend.resolve_device(options.device)
        self.dtype = backend.resolve_dtype(options.dtype, self.device)
        backend.configure_threads(options.threads)
        self.limits = MediaLimits.of(options)
        directory = str(self.layout.root)
        self.processor = transformers.AutoProcessor.from_pretrained(directory)  # type: ignore[no-untyped-call]
        model = model_class.from_pretrained(directory, dtype=self.dtype)
        self.model = model.to(self.device).eval()
        self.dimensions = int(self.model.config.embedding_dim)
        self._footprint = backend.module_bytes(self.model) * 2

    def unload(self) -> None:
        self.model = None
        self.processor = None

    def footprint(self) -> int:
        return self._footprint

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        prepared = []
        for index, item in enumerate(items):
            media = media_of(index, item, frozenset({Modality.IMAGE}))
            self._check_outputs(item)
            if media is not None:
                image = decode_image(media.data, index, self.limits)
                with processing(index, "image"):
                    encoded = self.processor.process_images([image], return_tensors="pt")
                group = "image"
            else:
                encoded = self.processor.process_queries([self._query(index, item)], return_tensors="pt")
                group = "text"
            data = {k: encoded[k][0].numpy() for k in encoded if k != "labels"}
            length = int(data["attention_mask"].sum())
            prepared.append(Prepared(index, length, length if group == "text" else 0, data, group))
        return prepared

    @staticmethod
    def _check_outputs(item: Item) -> None:
        assert isinstance(item, EmbedItem), "This is a bug: media_of lets only EmbedItem through"
        if item.outputs != {Output.MULTIVECTOR}:
            raise UnsupportedOperation(
                "this model produces multi-vectors only (one per token or image patch): ask for the "
                "'multivector' output, or rerank pages against a query with MaxSim",
                param="outputs",
            )

    @staticmethod
    def _query(index: int, item: Item) -> str:
        assert isinstance(item, EmbedItem), "This is a bug: media_of lets only EmbedItem through"
        if not isinstance(item.content, Text):
            raise InvalidInput(f"input {index}: this model takes text queries, not token ids", param="input")
        return item.prompt + item.content.text

    def collate(self, items: Sequence[Prepared]) -> PageBatch:
        left = self.processor.tokenizer.padding_side == "left"
        pad_id = int(self.processor.tokenizer.pad_token_id or 0)
        padded = pad([p.data["input_ids"].tolist() for p in items], pad_id, left=left)
        tensors = {
            "input_ids": torch.from_numpy(padded.input_ids),
            "attention_mask": torch.from_numpy(padded.attention_mask),
        }
        if "token_type_ids" in items[0].data:
            types = pad([p.data["token_type_ids"].tolist() for p in items], 0, left=left)
            tensors["token_type_ids"] = torch.from_numpy(types.input_ids)
        if "pixel_values" in items[0].data:
            tensors.update(self._pixels(items))
        moved = {k: v.to(self.device) for k, v in tensors.items()}
        return PageBatch(moved, tensors["attention_mask"].bool())

    def _pixels(self, items: Sequence[Prepared]) -> dict[str, torch.Tensor]:
        """Stack page pixels; ColQwen2's variable patch counts are padded to the longest."""
        pixels = [p.data["pixel_values"] for p in items]
        if "image_grid_thw" in items[0].data:
            longest = max(len(p) for p in pixels)
            pixels = [np.concatenate([p, np.zeros((longest - len(p), *p.shape[1:]), p.dtype)]) for p in pixels]
            grid = torch.from_numpy(np.stack([np.asarray(p.data["image_grid_thw"]).reshape(3) for p in items]))
            return {"pixel_values": torch.from_numpy(np.stack(pixels)).to(self.dtype), "image_grid_thw": grid}
        return {"pixel_values": torch.from_numpy(np.stack(pixels)).to(self.dtype)}

    def forward(self, batch: PageBatch) -> torch.Tensor:
        with torch.inference_mode():
            embeddings: torch.Tensor = self.model(**batch.tensors).embeddings
            return embeddings.float().cpu()

    def postprocess(self, batch: PageBatch, output: torch.Tensor) -> list[Result]:
        results: list[Result] = []
        for row, mask in zip(output.numpy(), batch.mask.numpy(), strict=True):
            results.append(Embedding(multivector=np.ascontiguousarray(row[mask], dtype=np.float32)))
        return results

    def describe(self) -> dict[str, Any]:
        return {"modalities": ["text", "image"], "scoring": "maxsim", "architectures": list(self.layout.architectures)}
