"""SigLIP 2 NaFlex through transformers (`Siglip2Model`): images at their own aspect ratio.

`Siglip2ImageProcessor` resizes each image, keeping its aspect ratio, to the most patches of
the vision tower's `patch_size` pixels that fit `max_num_patches`, and cuts it into a row of flattened patches with
its grid shape (`spatial_shapes`); the vision tower resizes its position embeddings to that grid.
An image costs its patch count, at most `max_num_patches` (the processor's, or the model entry's
`options: {max_num_patches: N}`). The processor pads every image to `max_num_patches` with masked
patches; a batch here is padded only to its longest image, which masked patches cannot change.
Texts are padded to the text tower's length (64) as `Siglip2Processor` pads them, with its mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from model_registry.adapters.towers import TwoTowerAdapter, features
from model_registry.detection.layout import Layout
from model_registry.errors import ModelUnavailable
from model_registry.media.decoding import decode_image, processing
from model_registry.types import Capability, Kind, Media, Modality, Prepared


@dataclass(frozen=True)
class Patches:
    values: torch.Tensor  # (patches, channels x patch_size x patch_size), the real patches only
    grid: tuple[int, int]  # patches down, patches across


class NaflexAdapter(TwoTowerAdapter):
    visual_tokens = True
    kind = Kind.IMAGE_TEXT
    capabilities = frozenset({Capability.EMBED_TEXT, Capability.EMBED_IMAGE})
    modality = Modality.IMAGE
    pad_to_max_length = True

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        super().__init__(layout, trust_remote_code)
        self.processor: Any = None
        self.max_num_patches = 0
        self.patch_size = 0

    def load_parts(self, directory: str) -> None:
        from transformers import AutoImageProcessor

        self.processor = AutoImageProcessor.from_pretrained(directory)  # type: ignore[no-untyped-call]
        configured = self.layout.options.get("max_num_patches", getattr(self.processor, "max_num_patches", None))
        if isinstance(configured, bool) or not isinstance(configured, int) or configured < 1:
            raise ModelUnavailable(
                f"options.max_num_patches must be a positive integer (the most patches an image is resized to), "
                f"got {configured!r}"
            )
        self.max_num_patches = configured
        self.patch_size = int(self.model.config.vision_config.patch_size)

    def unload(self) -> None:
        self.processor = None
        super().unload()

    def prepare_media(self, media: Media, index: int) -> tuple[Any, int]:
        image = decode_image(media.data, index, self.limits, self.resize)
        with processing(index, "image"):
            out = self.processor(
                images=[image], max_num_patches=self.max_num_patches, patch_size=self.patch_size, return_tensors="pt"
            )
        count = int(out["pixel_attention_mask"][0].sum())
        height, width = (int(n) for n in out["spatial_shapes"][0])
        values = out["pixel_values"][0, :count].to(torch.float32).contiguous()
        return Patches(values, (height, width)), count

    def resize(self, width: int, height: int) -> tuple[int, int]:
        """The size the processor resizes an image of `width` x `height` to (its own rule)."""
        from transformers.models.siglip2.image_processing_siglip2 import get_image_size_for_max_num_patches

        down, across = get_image_size_for_max_num_patches(height, width, self.patch_size, self.max_num_patches)
        return across, down

    def collate_media(self, items: Sequence[Prepared]) -> dict[str, torch.Tensor]:
        images: list[Patches] = [p.data for p in items]
        longest = max(len(image.values) for image in images)
        width = images[0].values.shape[1]
        values = torch.zeros((len(images), longest, width), dtype=torch.float32)
        mask = torch.zeros((len(images), longest), dtype=torch.int32)
        for row, image in enumerate(images):
            values[row, : len(image.values)] = image.values
            mask[row, : len(image.values)] = 1
        grids = torch.tensor([image.grid for image in images], dtype=torch.long)
        return {"pixel_values": values.to(self.dtype), "pixel_attention_mask": mask, "spatial_shapes": grids}

    def media_features(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        return features(self.model.get_image_features(**tensors))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "max_num_patches": self.max_num_patches}
