"""open_clip models from a local directory: `open_clip_config.json` (model_cfg + preprocess_cfg,
the layout of hub-style repos) beside `open_clip_model.safetensors` or `open_clip_pytorch_model.bin`.

open_clip (the `open_clip` extra) is imported only here. Its own tokenizer pads every text to the
context length and its own image transform resizes and normalises; both run in `prepare`. Where
that transform resizes the shortest edge and then center-crops, the image is cropped to the centre
first, so an extreme aspect ratio never becomes a huge resized tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.adapters.towers import tower_text
from model_registry.backends.torch import engine as backend
from model_registry.detection.layout import Layout
from model_registry.errors import ModelUnavailable
from model_registry.media.decoding import (
    Resize,
    crop_for_center_crop,
    decode_image,
    fixed_resize,
    media_of,
    processing,
    shortest_edge_resize,
)
from model_registry.types import Capability, Embedding, Item, Kind, MediaLimits, Modality, Prepared, Result


@dataclass(frozen=True)
class ClipBatch:
    group: str
    tensor: torch.Tensor


class OpenClipAdapter(Adapter):
    kind = Kind.IMAGE_TEXT
    capabilities = frozenset({Capability.EMBED_TEXT, Capability.EMBED_IMAGE})
    backend = "torch"

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        self.layout = layout
        self.model: Any = None
        self.transform: Any = None
        self.tokenizer: Any = None
        self.device = "cpu"
        self.dtype = torch.float32
        self.limits = MediaLimits()
        self.patches = 1
        self.center_crop: tuple[int, int, int] | None = None
        self.resize: Resize | None = None
        self._footprint = 0

    def load(self, options: LoadOptions) -> None:
        try:
            import open_clip
        except ImportError as error:
            raise ModelUnavailable(
                "open_clip models need the 'open_clip' extra: pip install 'infinity-server[open_clip]'"
            ) from error
        self.device = backend.resolve_device(options.device)
        self.dtype = backend.resolve_dtype(options.dtype, self.device)
        backend.configure_threads(options.threads)
        self.limits = options.media
        name = f"local-dir:{self.layout.root}"
        model, _, transform = open_clip.create_model_and_transforms(name, device=self.device, precision="fp32")
        self.model = model.to(dtype=self.dtype).eval()
        self.transform = transform
        self.center_crop = torchvision_center_crop(transform)
        self.resize = torchvision_resize(transform)
        self.tokenizer = open_clip.get_tokenizer(name)
        self.max_length = int(getattr(self.tokenizer, "context_length", 77))
        grid = getattr(self.model.visual, "grid_size", None)
        self.patches = int(np.prod(grid)) + 1 if grid else 1
        probe = self.model.encode_text(self.tokenizer(["a"]).to(self.device))
        self.dimensions = int(probe.shape[-1])
        self._footprint = backend.module_bytes(self.model) * 2

    def unload(self) -> None:
        self.model = self.transform = self.tokenizer = None

    def footprint(self) -> int:
        return self._footprint

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        prepared = []
        for index, item in enumerate(items):
            media = media_of(index, item, frozenset({Modality.IMAGE}))
            if media is not None:
                image = decode_image(media.data, index, self.limits, self.resize)
                with processing(index, "image"):
                    if self.center_crop is not None:
                        image = crop_for_center_crop(image, *self.center_crop)
                    pixels = self.transform(image)
                prepared.append(Prepared(index, self.patches, 0, pixels, "image"))
                continue
            ids = self.tokenizer([tower_text(index, item)])[0]
            used = int((ids != 0).sum())
            prepared.append(Prepared(index, self.max_length or used, used, ids, "text"))
        return prepared

    def collate(self, items: Sequence[Prepared]) -> ClipBatch:
        stacked = torch.stack([p.data for p in items]).to(self.device)
        if items[0].group == "image":
            stacked = stacked.to(self.dtype)
        return ClipBatch(items[0].group, stacked)

    def forward(self, batch: ClipBatch) -> torch.Tensor:
        with torch.inference_mode():
            encode = self.model.encode_image if batch.group == "image" else self.model.encode_text
            vectors: torch.Tensor = encode(batch.tensor)
            return vectors.float().cpu()

    def postprocess(self, batch: ClipBatch, output: torch.Tensor) -> list[Result]:
        array = np.ascontiguousarray(output.numpy(), dtype=np.float32)
        return [Embedding(dense=row) for row in array]

    def describe(self) -> dict[str, Any]:
        return {"modalities": ["text", "image"], "library": "open_clip"}


def torchvision_center_crop(transform: Any) -> tuple[int, int, int] | None:
    """(shortest edge, crop width, crop height) when `transform` is Resize(int) then CenterCrop."""
    steps = list(getattr(transform, "transforms", ()))
    names = [type(step).__name__ for step in steps]
    if "Resize" not in names or "CenterCrop" not in names or names.index("Resize") > names.index("CenterCrop"):
        return None
    resize, crop = steps[names.index("Resize")], steps[names.index("CenterCrop")]
    edge = resize.size[0] if isinstance(resize.size, (list, tuple)) and len(resize.size) == 1 else resize.size
    size = crop.size if isinstance(crop.size, (list, tuple)) else (crop.size, crop.size)
    if not isinstance(edge, int) or getattr(resize, "max_size", None) or len(size) != 2:
        return None
    return edge, int(size[1]), int(size[0])


def torchvision_resize(transform: Any) -> Resize | None:
    """The resize of `transform` where its first step is torchvision's plain `Resize`: the shortest
    edge to a length, or a fixed (height, width)."""
    steps = list(getattr(transform, "transforms", ()))
    first = steps[0] if steps else None
    if type(first).__name__ != "Resize" or getattr(first, "max_size", None):
        return None
    size = first.size  # type: ignore[union-attr]
    sides = list(size) if isinstance(size, (list, tuple)) else [size]
    if not all(isinstance(side, int) and side > 0 for side in sides):
        return None
    if len(sides) == 1:
        return shortest_edge_resize(sides[0])
    return fixed_resize(sides[1], sides[0]) if len(sides) == 2 else None
