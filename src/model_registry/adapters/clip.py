"""CLIP and SigLIP through transformers: text and image towers in one space.

Images are preprocessed by the model's own image processor (`preprocessor_config.json`), in
`prepare`, so decoding and resizing run in the worker pool while earlier batches compute.
An image costs its patch count (plus the class token), a text its tokens. Where the processor
resizes the shortest edge and then center-crops (CLIP), the image is cropped to that centre
first, so an extreme aspect ratio never becomes a huge resized array.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from model_registry.adapters.towers import TwoTowerAdapter, features
from model_registry.detection.layout import Layout
from model_registry.media.decoding import (
    Resize,
    crop_for_center_crop,
    decode_image,
    fixed_resize,
    processing,
    shortest_edge_resize,
)
from model_registry.types import Capability, Kind, Media, Modality, Prepared


class ClipAdapter(TwoTowerAdapter):
    kind = Kind.IMAGE_TEXT
    capabilities = frozenset({Capability.EMBED_TEXT, Capability.EMBED_IMAGE})
    modality = Modality.IMAGE

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        super().__init__(layout, trust_remote_code)
        self.pad_to_max_length = layout.model_type == "siglip"
        self.processor: Any = None
        self.patches = 1
        self.center_crop: tuple[int, int, int] | None = None
        self.resize: Resize | None = None

    def load_parts(self, directory: str) -> None:
        from transformers import AutoImageProcessor

        self.processor = AutoImageProcessor.from_pretrained(directory)  # type: ignore[no-untyped-call]
        vision = self.model.config.vision_config
        side = int(vision.image_size) // int(vision.patch_size)
        self.patches = side * side + 1
        self.center_crop = center_crop_of(self.processor)
        self.resize = resize_of(self.processor)

    def unload(self) -> None:
        self.processor = None
        super().unload()

    def prepare_media(self, media: Media, index: int) -> tuple[Any, int]:
        image = decode_image(media.data, index, self.limits, self.resize)
        with processing(index, "image"):
            if self.center_crop is not None:
                image = crop_for_center_crop(image, *self.center_crop)
            pixels = self.processor(images=[image], return_tensors="np")["pixel_values"][0]
        return np.ascontiguousarray(pixels, dtype=np.float32), self.patches

    def collate_media(self, items: Sequence[Prepared]) -> dict[str, torch.Tensor]:
        stacked = torch.from_numpy(np.stack([p.data for p in items]))
        return {"pixel_values": stacked.to(self.dtype)}

    def media_features(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        return features(self.model.get_image_features(**tensors))


def center_crop_of(processor: Any) -> tuple[int, int, int] | None:
    """(shortest edge, crop width, crop height) of a resize-shortest-edge-then-center-crop processor."""
    size, crop = getattr(processor, "size", None) or {}, getattr(processor, "crop_size", None) or {}
    edge = size.get("shortest_edge") if hasattr(size, "get") else None
    width, height = (crop.get("width"), crop.get("height")) if hasattr(crop, "get") else (None, None)
    if not (getattr(processor, "do_resize", False) and getattr(processor, "do_center_crop", False)):
        return None
    if not all(isinstance(v, int) and v > 0 for v in (edge, width, height)):
        return None
    return int(edge), int(width), int(height)  # type: ignore[arg-type]


def resize_of(processor: Any) -> Resize | None:
    """The resize a transformers image processor applies, where it is one of the two plain kinds:
    the shortest edge to a length (CLIP), or a fixed height and width (SigLIP, PaliGemma)."""
    size = getattr(processor, "size", None)
    if not getattr(processor, "do_resize", False) or size is None:
        return None
    given = {key: value for key, value in dict(size).items() if value is not None}
    if set(given) == {"shortest_edge"} and _positive(given["shortest_edge"]):
        return shortest_edge_resize(int(given["shortest_edge"]))
    if set(given) == {"height", "width"} and _positive(given["height"]) and _positive(given["width"]):
        return fixed_resize(int(given["width"]), int(given["height"]))
    return None


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
