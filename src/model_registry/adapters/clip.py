"""CLIP and SigLIP through transformers: text and image towers in one space.

Images are preprocessed by the model's own image processor (`preprocessor_config.json`), in
`prepare`, so decoding and resizing run in the worker pool while earlier batches compute.
An image costs its patch count (plus the class token), a text its tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from model_registry.adapters.towers import TwoTowerAdapter, features
from model_registry.detect import Layout
from model_registry.media import decode_image
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

    def load_parts(self, directory: str) -> None:
        from transformers import AutoImageProcessor

        self.processor = AutoImageProcessor.from_pretrained(directory)  # type: ignore[no-untyped-call]
        vision = self.model.config.vision_config
        side = int(vision.image_size) // int(vision.patch_size)
        self.patches = side * side + 1

    def unload(self) -> None:
        self.processor = None
        super().unload()

    def prepare_media(self, media: Media, index: int) -> tuple[Any, int]:
        image = decode_image(media.data, index, self.limits)
        pixels = self.processor(images=[image], return_tensors="np")["pixel_values"][0]
        return np.ascontiguousarray(pixels, dtype=np.float32), self.patches

    def collate_media(self, items: Sequence[Prepared]) -> dict[str, torch.Tensor]:
        stacked = torch.from_numpy(np.stack([p.data for p in items]))
        return {"pixel_values": stacked.to(self.dtype)}

    def media_features(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        return features(self.model.get_image_features(**tensors))
