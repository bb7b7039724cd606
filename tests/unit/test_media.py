from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
import soundfile

from model_registry.errors import InvalidInput
from model_registry.media import MediaLimits, decode_audio, decode_image
from tests.builders.media import image_bytes, wav_bytes


def test_decodes_the_real_photo(data_dir: Path) -> None:
    image = decode_image((data_dir / "cats_coco_sample.jpg").read_bytes(), 0, MediaLimits())
    assert image.mode == "RGB"
    assert image.size[0] * image.size[1] > 100_000


def test_image_over_the_pixel_limit_is_refused_before_decoding() -> None:
    with pytest.raises(InvalidInput, match=r"input 3: the image is 40x30 = 1,200 pixels, more than the limit of 1,000"):
        decode_image(image_bytes(40, 30), 3, MediaLimits(max_image_pixels=1000))


def one_colour_png(side: int) -> bytes:
    """A huge, single-colour PNG: tiny compressed, `side`² pixels once decoded."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("1", (side, side)).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def test_decompression_bomb_is_refused() -> None:
    bomb = one_colour_png(20_000)  # 400 megapixels in a few hundred KiB
    assert len(bomb) < 2_000_000
    with pytest.raises(InvalidInput, match="input 1: the image"):
        decode_image(bomb, 1, MediaLimits())
    # Even with our own limit lifted, Pillow's bomb check still refuses it.
    with pytest.raises(InvalidInput, match="decompression bomb"):
        decode_image(bomb, 1, MediaLimits(max_image_pixels=10**12))


def test_truncated_jpeg_names_the_index(data_dir: Path) -> None:
    photo = (data_dir / "cats_coco_sample.jpg").read_bytes()
    with pytest.raises(InvalidInput, match=r"input 2: the image is corrupt or truncated"):
        decode_image(photo[: len(photo) // 2], 2, MediaLimits())


def test_not_an_image() -> None:
    with pytest.raises(InvalidInput, match="input 0: the data is not an image"):
        decode_image(b"hello, world", 0, MediaLimits())


def test_audio_is_downmixed_and_resampled() -> None:
    stereo = wav_bytes(0.5, rate=16000, channels=2)
    samples = decode_audio(stereo, 0, 48000, MediaLimits())
    assert samples.dtype == np.float32
    assert samples.ndim == 1
    assert abs(len(samples) - 24000) <= 2
    reference, _ = soundfile.read(io.BytesIO(stereo), dtype="float32")
    assert abs(float(samples.mean()) - float(reference.mean())) < 1e-3


def test_audio_longer_than_the_limit() -> None:
    with pytest.raises(InvalidInput, match=r"input 4: the audio lasts 3.0s, longer than the limit of 2s"):
        decode_audio(wav_bytes(3.0), 4, 16000, MediaLimits(max_audio_seconds=2))


def lying_wav(declared_frames: int, actual_frames: int) -> bytes:
    """A 16-bit mono WAV whose header claims `declared_frames` but holds `actual_frames`."""
    body = np.zeros(actual_frames, dtype="<i2").tobytes()
    size = declared_frames * 2
    header = b"RIFF" + struct.pack("<I", 36 + size) + b"WAVE"
    fmt = b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, 16000, 32000, 2, 16)
    return header + fmt + b"data" + struct.pack("<I", size) + body


@pytest.mark.parametrize("declared", [16000 * 3600 * 10, 16000])
def test_wav_header_that_claims_more_than_it_holds_is_refused(declared: int) -> None:
    wav = lying_wav(declared_frames=declared, actual_frames=800)
    with pytest.raises(
        InvalidInput, match=r"input 0: the WAV header declares [\d,]+ bytes of audio but the file holds 1,600"
    ):
        decode_audio(wav, 0, 16000, MediaLimits(max_audio_seconds=60))


def test_wav_with_an_open_ended_size_is_read() -> None:
    wav = lying_wav(declared_frames=0, actual_frames=800)
    wav = wav[:40] + (0xFFFFFFFF).to_bytes(4, "little") + wav[44:]
    assert len(decode_audio(wav, 0, 16000, MediaLimits())) == 800


def test_wav_header_that_claims_less_is_read_as_declared() -> None:
    assert len(decode_audio(lying_wav(declared_frames=100, actual_frames=800), 0, 16000, MediaLimits())) == 100


def test_corrupt_audio_names_the_index() -> None:
    with pytest.raises(InvalidInput, match="input 5: the audio cannot be decoded"):
        decode_audio(b"RIFF\x00\x00\x00\x00WAVEjunk", 5, 16000, MediaLimits())
