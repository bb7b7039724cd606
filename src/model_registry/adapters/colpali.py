"""ColPali, ColQwen2 and ColModernVBert through transformers: page images and text queries to
multi-vectors.

The model's own processor builds the inputs (the image prompt and its image tokens; the query
prefix and augmentation tokens), one item at a time in `prepare`; `collate` pads them. A page
costs its sequence length (image tokens included, as many as the processor's resizing gives a
dynamic-resolution model such as ColQwen2), a query its tokens; both count in the request's usage,
and the cost in admission and batching. Output rows are
L2-normalised by the model; padding rows are dropped, so MaxSim sees real tokens only. There is
no single-vector output: a request must ask for `multivector`. A query longer than the model
takes (`max_length`, else the text model's positions) has its text cut, keeping the processor's
prefix and augmentation suffix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.adapters.clip import resize_of
from model_registry.adapters.text import pad
from model_registry.backends.torch import engine as backend
from model_registry.backends.weights import from_pretrained_checked
from model_registry.detection.layout import Layout
from model_registry.errors import InvalidInput, UnsupportedOperation
from model_registry.media.decoding import Resize, decode_image, media_of, processing
from model_registry.types import (
    Capability,
    Embedding,
    EmbedItem,
    Item,
    Kind,
    MediaLimits,
    Modality,
    Output,
    Prepared,
    Result,
    Text,
)

_CLASSES = {
    "ColPaliForRetrieval": "ColPaliForRetrieval",
    "ColQwen2ForRetrieval": "ColQwen2ForRetrieval",
    "ColModernVBertForRetrieval": "ColModernVBertForRetrieval",
}


def _working_pixels(images: Any) -> int:
    """The pixels the image processor works a page at: PaliGemma's fixed size, Qwen2-VL's most
    pixels, Idefics3's longest edge squared (ColModernVBert); 448 x 448 where it says none."""
    size = {k: v for k, v in dict(getattr(images, "size", None) or {}).items() if isinstance(v, int) and v > 0}
    most = getattr(images, "max_pixels", None)
    if isinstance(most, int) and most > 0:
        return most
    if "height" in size and "width" in size:
        return int(size["height"] * size["width"])
    if "longest_edge" in size:  # Qwen2-VL's newer processors keep max_pixels here; Idefics3 an edge
        edge = int(size["longest_edge"])
        return edge if "shortest_edge" in size else edge * edge
    return 448 * 448


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
        self.query_max_length = 512
        self.resize: Resize | None = None
        self._footprint = 0

    def load(self, options: LoadOptions) -> None:
        import transformers

        name = next((a for a in self.layout.architectures if a in _CLASSES), "ColPaliForRetrieval")
        model_class = getattr(transformers, _CLASSES[name])
        self.device = backend.resolve_device(options.device)
        self.dtype = backend.resolve_dtype(options.dtype, self.device)
        backend.configure_threads(options.threads)
        self.limits = options.media
        directory = str(self.layout.root)
        self.processor = transformers.AutoProcessor.from_pretrained(directory)  # type: ignore[no-untyped-call]
        self.resize = resize_of(self.processor.image_processor)  # PaliGemma's fixed size; None for ColQwen2's
        self.page_pixels = _working_pixels(self.processor.image_processor)
        model = from_pretrained_checked(model_class, self.layout.root, "page retrieval", dtype=self.dtype)
        self.model = model.to(self.device).eval()
        self.dimensions = int(self.model.config.embedding_dim)
        # Not `max_length`: the warm-up would then build token-id batches, which this model does not take.
        self.query_max_length = self._query_limit()
        # The tokenizer's wrapper sets padding on its Rust tokenizer at a call that asks for other
        # settings, which must not race a prepare thread's encoding: every call here asks for the
        # processor's own (padding to the longest, no truncation), first here, before any thread.
        self.processor.process_queries([""], return_tensors="pt")
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
                image = decode_image(media.data, index, self.limits, self.resize)
                with processing(index, "image"):
                    encoded = self.processor.process_images([image], return_tensors="pt")
                group = "image"
            else:
                encoded = self._encode_query(self._query(index, item))
                group = "text"
            data = {k: encoded[k][0].numpy() for k in encoded if k != "labels"}
            length = int(data["attention_mask"].sum())
            # A page is read as a sequence: its visual tokens count in the request's usage as text does.
            prepared.append(Prepared(index, length, length, data, group))
        return prepared

    def _query_limit(self) -> int:
        """Tokens a query may take: the configured max_length, the text model's positions, the tokenizer's."""
        vlm = getattr(self.model.config, "vlm_config", None)
        text_config = getattr(vlm, "text_config", None) or getattr(self.model.config, "text_config", None)
        limits = [
            self.layout.max_length,
            getattr(text_config, "max_position_embeddings", None),
            getattr(self.processor.tokenizer, "model_max_length", None),
        ]
        usable = [n for n in limits if isinstance(n, int) and 0 < n < 1_000_000]
        return min(usable) if usable else 512

    def _encode_query(self, text: str) -> Any:
        """The processor's query encoding, its text cut so that the whole fits `max_length`.

        The processor wraps the text in a prefix and a suffix of augmentation tokens that the model
        relies on, so the user's text is cut (at a token boundary), never the suffix.
        """
        encoded = self.processor.process_queries([text], return_tensors="pt")
        limit = self.query_max_length
        for _ in range(4):  # re-tokenizing the cut text can merge differently at the cut; converge
            excess = int(encoded["attention_mask"].sum()) - limit
            if excess <= 0:
                return encoded
            text = self._cut(text, excess)
            encoded = self.processor.process_queries([text], return_tensors="pt")
        return encoded if int(encoded["attention_mask"].sum()) <= limit else self._overhead_only(limit)

    def _cut(self, text: str, excess: int) -> str:
        """`text` without its last `excess` tokens."""
        tokenized = self.processor.tokenizer(
            text, add_special_tokens=False, return_offsets_mapping=True, padding="longest"
        )
        offsets = tokenized["offset_mapping"]
        keep = len(offsets) - excess
        return text[: int(offsets[keep - 1][1])] if keep > 0 else ""

    def _overhead_only(self, limit: int) -> Any:
        encoded = self.processor.process_queries([""], return_tensors="pt")
        if int(encoded["attention_mask"].sum()) > limit:
            raise InvalidInput(f"max_length {limit} is shorter than the model's own query prefix and suffix")
        return encoded

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
        """Stack page pixels; ColQwen2's variable patch counts are padded to the longest, and
        ColModernVBert's variable tile counts with all-zero tiles, which the model skips."""
        pixels = [p.data["pixel_values"] for p in items]
        if "pixel_attention_mask" in items[0].data:
            longest = max(len(p) for p in pixels)
            masks = [p.data["pixel_attention_mask"] for p in items]
            pixels = [np.concatenate([p, np.zeros((longest - len(p), *p.shape[1:]), p.dtype)]) for p in pixels]
            masks = [np.concatenate([m, np.zeros((longest - len(m), *m.shape[1:]), m.dtype)]) for m in masks]
            return {
                "pixel_values": torch.from_numpy(np.stack(pixels)).to(self.dtype),
                "pixel_attention_mask": torch.from_numpy(np.stack(masks)),
            }
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
