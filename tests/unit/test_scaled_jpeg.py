"""JPEGs decoded at a reduced scale for the model's resize, and EXIF orientation, against the
references: transformers' `load_image` (a whole decode, turned as EXIF says) and each family's
own processor."""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from model_registry.adapters import create_adapter
from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.config import ModelSpec
from model_registry.media.decoding import decode_image, fixed_resize, jpeg_scale, shortest_edge_resize
from model_registry.types import EmbedItem, Media, MediaLimits, Modality, Output
from tests.builders.media import tiny_clip, tiny_colpali, tiny_open_clip, tiny_siglip, tiny_siglip2_naflex

PHOTO = "cats_coco_sample.jpg"
#: Normalised pixel values (about 1/0.27 per unit of 1.0 brightness): a whole decode and a reduced
#: one differ by at most 2/255 of brightness per pixel, about 0.03 here, and far less on average.
MEAN_TOLERANCE, MAX_TOLERANCE = 0.01, 0.05


def jpeg(data_dir: Path, size: tuple[int, int], orientation: int = 1) -> bytes:
    """The real photo resized to `size` and stored as a JPEG with that EXIF orientation."""
    from PIL import Image

    photo = Image.open(data_dir / PHOTO).convert("RGB").resize(size, Image.Resampling.BICUBIC)
    exif = Image.Exif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    photo.save(buffer, format="JPEG", quality=90, exif=exif.tobytes())
    return buffer.getvalue()


def reference_image(data: bytes, tmp_path: Path) -> Any:
    from transformers.image_utils import load_image

    path = tmp_path / "photo.jpg"
    path.write_bytes(data)
    return load_image(str(path))


@pytest.mark.parametrize(
    ("size", "resize", "want"),
    [
        ((4000, 3000), shortest_edge_resize(224), 4),  # 500 x 375 would be under twice 298 x 224
        ((4032, 3024), shortest_edge_resize(224), 4),
        ((4001, 3000), shortest_edge_resize(224), 1),  # 8, 4 and 2 do not divide 4001
        ((4002, 3000), shortest_edge_resize(224), 2),
        ((640, 480), fixed_resize(32, 32), 4),  # 80 x 60 would be under twice 32 x 32
        ((448, 448), fixed_resize(224, 224), 1),
        ((800, 800), lambda w, h: (w // 100 + 1, h // 100 + 1), 1),  # never the same size reduced
    ],
)
def test_the_scale_keeps_the_shape_and_twice_the_resize(
    size: tuple[int, int], resize: Callable[[int, int], tuple[int, int]], want: int
) -> None:
    assert jpeg_scale(*size, resize) == want


def test_a_large_jpeg_is_decoded_reduced_only_where_asked(data_dir: Path) -> None:
    data = jpeg(data_dir, (4000, 3000))
    resize = shortest_edge_resize(224)
    assert decode_image(data, 0, MediaLimits(), resize).size == (1000, 750)
    assert decode_image(data, 0, MediaLimits()).size == (4000, 3000)
    assert decode_image(data, 0, MediaLimits(scaled_jpeg=False), resize).size == (4000, 3000)


def test_a_png_is_always_decoded_whole(data_dir: Path) -> None:
    from PIL import Image

    buffer = io.BytesIO()
    Image.open(data_dir / PHOTO).convert("RGB").resize((1600, 1200)).save(buffer, format="PNG")
    assert decode_image(buffer.getvalue(), 0, MediaLimits(), shortest_edge_resize(32)).size == (1600, 1200)


@pytest.mark.parametrize("orientation", [1, 2, 3, 4, 5, 6, 7, 8])
def test_exif_orientation_is_applied_as_transformers_load_image_does(
    data_dir: Path, tmp_path: Path, orientation: int
) -> None:
    data = jpeg(data_dir, (320, 240), orientation)
    got = decode_image(data, 0, MediaLimits())
    want = reference_image(data, tmp_path)
    assert got.size == want.size
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def exif_orientation_as(kind: int, payload: bytes) -> bytes:
    """An EXIF block whose one entry is the orientation stored as TIFF type `kind` (8 bytes of it)."""
    data_offset = 8 + 2 + 12 + 4  # header, entry count, the entry, the next IFD's offset
    entry = struct.pack("<HHII", 0x0112, kind, 1, data_offset)
    return b"Exif\x00\x00II*\x00" + struct.pack("<IH", 8, 1) + entry + struct.pack("<I", 0) + payload


@pytest.mark.parametrize(
    "block",
    [exif_orientation_as(5, struct.pack("<II", 6, 1)), exif_orientation_as(12, struct.pack("<d", 6.0))],
    ids=["rational 6/1", "double 6.0"],
)
def test_an_orientation_written_as_another_number_type_is_applied_too(
    data_dir: Path, tmp_path: Path, block: bytes
) -> None:
    from PIL import Image

    buffer = io.BytesIO()
    Image.open(data_dir / PHOTO).convert("RGB").resize((64, 48)).save(buffer, format="JPEG", exif=block)
    data = buffer.getvalue()
    want = reference_image(data, tmp_path)
    assert want.size == (48, 64)  # the reference turns it
    np.testing.assert_array_equal(np.asarray(decode_image(data, 0, MediaLimits())), np.asarray(want))


def test_a_turned_jpeg_is_reduced_by_its_shown_shape(data_dir: Path, tmp_path: Path) -> None:
    data = jpeg(data_dir, (4000, 3000), orientation=6)  # stored landscape, shown portrait
    got = decode_image(data, 0, MediaLimits(), shortest_edge_resize(224))
    assert got.size == (750, 1000)
    want = reference_image(data, tmp_path).resize((224, 298), 3)
    assert np.abs(np.asarray(got.resize((224, 298), 3), dtype=float) - np.asarray(want, dtype=float)).max() <= 3


def loaded(path: Path) -> Adapter:
    adapter = create_adapter(ModelSpec(name="m", source=str(path)))
    adapter.load(LoadOptions(device="cpu", dtype="float32", max_batch_tokens=1024))
    return adapter


def _pixels(adapter: Any, data: bytes) -> np.ndarray:
    if hasattr(adapter, "prepare_media"):
        out = adapter.prepare_media(Media(Modality.IMAGE, data), 0)[0]
        return np.asarray(getattr(out, "values", out))
    item = EmbedItem(Media(Modality.IMAGE, data), outputs=frozenset({Output.MULTIVECTOR}))  # ColPali: only these
    prepared = adapter.prepare([item])[0].data
    return np.asarray(prepared["pixel_values"] if isinstance(prepared, dict) else prepared)


def _reference(family: str, root: Path, image: Any) -> np.ndarray:
    """The family's own preprocessing of the whole, EXIF-turned image."""
    import transformers

    if family == "open_clip":
        import open_clip

        _, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{root}")
        return np.asarray(preprocess(image), dtype=np.float32)
    if family == "naflex":
        processor = transformers.AutoImageProcessor.from_pretrained(root)
        out = processor(images=[image], return_tensors="pt")
        count = int(out["pixel_attention_mask"][0].sum())
        return np.asarray(out["pixel_values"][0, :count].numpy(), dtype=np.float32)
    if family == "colpali":
        processor = transformers.AutoProcessor.from_pretrained(root)
        return np.asarray(processor.process_images([image])["pixel_values"][0].numpy(), dtype=np.float32)
    processor = transformers.AutoImageProcessor.from_pretrained(root)
    return np.asarray(processor(images=[image], return_tensors="np")["pixel_values"][0], dtype=np.float32)


BUILDERS = {
    "clip": tiny_clip,
    "siglip": tiny_siglip,
    "open_clip": tiny_open_clip,
    "naflex": tiny_siglip2_naflex,
    "colpali": tiny_colpali,
}


@pytest.mark.parametrize("family", list(BUILDERS))
def test_each_family_sees_the_pixels_of_a_whole_decode(
    tmp_path_factory: pytest.TempPathFactory, data_dir: Path, tmp_path: Path, family: str
) -> None:
    root = BUILDERS[family](tmp_path_factory.mktemp(family))
    adapter = loaded(root)
    data = jpeg(data_dir, (4000, 3000), orientation=3)
    resize = getattr(adapter, "resize", None)
    assert resize is not None, "the family's resize was not recognised"
    assert jpeg_scale(4000, 3000, resize) > 1, "nothing to compare: the photo is decoded whole"
    with torch.inference_mode():
        got = _pixels(adapter, data)
    want = _reference(family, root, reference_image(data, tmp_path))
    assert got.shape == want.shape
    difference = np.abs(got.astype(np.float64) - want.astype(np.float64))
    assert difference.mean() <= MEAN_TOLERANCE
    assert difference.max() <= MAX_TOLERANCE
