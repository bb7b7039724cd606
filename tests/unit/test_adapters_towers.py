"""Media adapters price items by patches or frames (not bytes or pixels) and keep towers apart."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from model_registry.adapters import create_adapter
from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.config import ModelSpec
from model_registry.errors import InvalidInput
from model_registry.types import EmbedItem, Media, Modality, Text, TokenIds
from tests.builders.media import image_bytes, tiny_clap, tiny_clip, wav_bytes


def loaded(path: Path) -> Adapter:
    adapter = create_adapter(ModelSpec(name="m", source=str(path)))
    adapter.load(LoadOptions(device="cpu", dtype="float32", max_batch_tokens=1024))
    return adapter


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Adapter:
    return loaded(tiny_clip(tmp_path_factory.mktemp("clip")))


@pytest.fixture(scope="module")
def clap(tmp_path_factory: pytest.TempPathFactory) -> Adapter:
    return loaded(tiny_clap(tmp_path_factory.mktemp("clap")))


def test_an_image_costs_its_patches_whatever_its_size(clip: Adapter) -> None:
    items = [
        EmbedItem(Media(Modality.IMAGE, image_bytes(2400, 1600))),
        EmbedItem(Media(Modality.IMAGE, image_bytes(20, 10))),
        EmbedItem(Text("two cats")),
    ]
    big, small, text = clip.prepare(items)
    assert big.cost == small.cost == (32 // 8) ** 2 + 1  # 16 patches and the class token
    assert big.data.shape == small.data.shape == (3, 32, 32)
    assert (big.group, small.group, text.group) == ("image", "image", "text")
    assert text.cost == text.tokens == len(text.data)


def test_an_audio_clip_costs_its_frames_whatever_its_length(clap: Adapter) -> None:
    long_clip, short_clip = clap.prepare(
        [EmbedItem(Media(Modality.AUDIO, wav_bytes(30.0, rate=8000))), EmbedItem(Media(Modality.AUDIO, wav_bytes(0.1)))]
    )
    assert long_clip.cost == short_clip.cost == 48000 // 480 + 1  # one second of 10 ms hops
    assert long_clip.group == "audio"


def test_wrong_modality_and_token_ids_name_the_index(clip: Adapter, clap: Adapter) -> None:
    with pytest.raises(InvalidInput, match="input 1: this model cannot embed audio"):
        clip.prepare([EmbedItem(Text("a")), EmbedItem(Media(Modality.AUDIO, wav_bytes(0.1)))])
    with pytest.raises(InvalidInput, match="input 0: this model cannot embed image"):
        clap.prepare([EmbedItem(Media(Modality.IMAGE, image_bytes(8, 8)))])
    with pytest.raises(InvalidInput, match="input 0: this model takes text, not token ids"):
        clip.prepare([EmbedItem(TokenIds((1, 2, 3)))])


def test_a_wide_strip_is_cropped_before_the_resize(clip: Adapter) -> None:
    """A 6000 x 30 image: the processor alone would resize it to 6400 x 32 first; the crop comes first."""
    from tests.builders.media import smooth_image

    buffer = io.BytesIO()
    smooth_image(6000, 30).save(buffer, format="PNG")
    (prepared,) = clip.prepare([EmbedItem(Media(Modality.IMAGE, buffer.getvalue()))])
    assert prepared.data.shape == (3, 32, 32)


def test_a_processor_refusal_names_the_input(clip: Adapter) -> None:
    with pytest.raises(InvalidInput, match="input 1: the image is 900x2, an aspect ratio past"):
        clip.prepare([EmbedItem(Text("a")), EmbedItem(Media(Modality.IMAGE, image_bytes(900, 2)))])
