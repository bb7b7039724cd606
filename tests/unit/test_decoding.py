from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import soundfile

from model_registry.errors import InvalidInput
from model_registry.media.decoding import decode_audio, decode_image
from model_registry.types import MediaLimits
from tests.builders.media import image_bytes, lying_wav, one_colour_png, smooth_image, strip_png, wav_bytes


def test_decodes_the_real_photo(data_dir: Path) -> None:
    image = decode_image((data_dir / "cats_coco_sample.jpg").read_bytes(), 0, MediaLimits())
    assert image.mode == "RGB"
    assert image.size[0] * image.size[1] > 100_000


def test_image_over_the_pixel_limit_is_refused_before_decoding() -> None:
    with pytest.raises(InvalidInput, match=r"input 3: the image is 40x30 = 1,200 pixels, more than the limit of 1,000"):
        decode_image(image_bytes(40, 30), 3, MediaLimits(max_image_pixels=1000))


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


@pytest.mark.parametrize("peak", [1e38, 2e6])
def test_float_samples_past_the_sample_limit_are_refused(peak: float) -> None:
    # 1e38 once gave a CLAP embedding of NaNs: its spectrogram's powers overflow float32.
    loud = np.full((1600, 2), peak, dtype=np.float32)
    buffer = io.BytesIO()
    soundfile.write(buffer, loud, 16000, format="WAV", subtype="FLOAT")
    with pytest.raises(InvalidInput, match="input 2: the audio's samples reach"):
        decode_audio(buffer.getvalue(), 2, 16000, MediaLimits())
    buffer = io.BytesIO()
    soundfile.write(buffer, np.full((1600, 2), 32767.0, dtype=np.float32), 16000, format="WAV", subtype="FLOAT")
    assert float(decode_audio(buffer.getvalue(), 2, 16000, MediaLimits()).max()) == pytest.approx(32767.0, rel=1e-3)


def test_extreme_aspect_ratio_is_refused_from_the_header() -> None:
    strip = strip_png(100_000, 1)
    assert len(strip) < 400
    with pytest.raises(InvalidInput, match=r"input 2: the image is 100000x1, an aspect ratio past the limit of 200:1"):
        decode_image(strip, 2, MediaLimits())
    assert decode_image(strip_png(1000, 5), 0, MediaLimits()).size == (1000, 5)


def test_expansion_past_the_ratio_is_refused_but_small_images_always_pass() -> None:
    flat = strip_png(3000, 3000)  # 27 MB of pixels from a few KB
    with pytest.raises(InvalidInput, match=r"input 0: the image's [\d,]+ bytes decode to 27,000,000 bytes of pixels"):
        decode_image(flat, 0, MediaLimits())
    assert decode_image(flat, 0, MediaLimits(max_media_expansion=100_000)).size == (3000, 3000)
    assert decode_image(strip_png(1000, 1000), 0, MediaLimits()).size == (1000, 1000)  # under the floor


@pytest.mark.parametrize("size", [(400, 20), (20, 400), (1000, 37), (3001, 250), (64, 48)])
def test_crop_before_center_crop_keeps_what_the_processor_keeps(size: tuple[int, int]) -> None:
    """The processor's output is the same (to rounding) from the pre-cropped image as from the whole one."""
    from transformers import CLIPImageProcessor

    from model_registry.media.decoding import crop_for_center_crop

    processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    image = smooth_image(*size)
    cropped = crop_for_center_crop(image, 32, 32, 32)
    whole = processor(images=[image], return_tensors="np")["pixel_values"][0]
    part = processor(images=[cropped], return_tensors="np")["pixel_values"][0]
    assert float(np.abs(whole - part).mean()) < 0.03
    short = min(size)
    assert max(cropped.size) <= max(short, 2 * short + 2 * (3 * short // 32 + 3) + 1)


def test_only_the_window_is_decoded_and_resampled() -> None:
    clip = wav_bytes(20.0, rate=8000, channels=2)
    whole = decode_audio(clip, 0, 48000, MediaLimits())
    window = decode_audio(clip, 0, 48000, MediaLimits(), window=48000)
    assert len(window) == 48000
    assert np.allclose(window[:47000], whole[:47000], atol=1e-3)  # the filter's tail differs at the cut only


def test_channels_times_frames_are_limited_before_decoding() -> None:
    many = wav_bytes(1.0, rate=48000, channels=8)  # 384,000 samples
    with pytest.raises(InvalidInput, match=r"input 1: the audio would decode to 8 channels x 48,000 frames"):
        decode_audio(many, 1, 48000, MediaLimits(max_audio_samples=100_000))
    # Only the window counts: a quarter second of eight channels fits.
    assert len(decode_audio(many, 1, 48000, MediaLimits(max_audio_samples=100_000), window=12000)) == 12000


def test_a_low_rate_clip_is_refused_by_its_resampled_length_before_any_sample_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """300 frames at 10 Hz pass any frame count, but at 48 kHz they are 300 x 4,800 samples."""

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("samples were read before the resampled length was checked")

    clip = wav_bytes(30.0, rate=10)
    limits = MediaLimits(max_audio_samples=1_000_000)
    monkeypatch.setattr(soundfile.SoundFile, "read", never)
    with pytest.raises(
        InvalidInput,
        match=r"input 2: the audio's 300 frames at 10 Hz would resample to 1,440,000 samples at 48,000 Hz, "
        r"more than the limit of 1,000,000 \(max_audio_samples\)",
    ):
        decode_audio(clip, 2, 48000, limits)
    monkeypatch.undo()
    assert len(decode_audio(clip, 2, 48000, MediaLimits(max_audio_samples=1_440_000))) == 1_440_000


def test_the_window_s_resampled_read_is_what_counts() -> None:
    """With a window, the frames read (the window plus the resampler's margin) are what resamples."""
    clip = wav_bytes(600.0, rate=1)  # the model reads 1 + 256 frames of it: 12,336,000 samples at 48 kHz
    with pytest.raises(InvalidInput, match=r"input 0: the audio's 257 frames at 1 Hz would resample to 12,336,000"):
        decode_audio(clip, 0, 48000, MediaLimits(max_audio_samples=1_000_000), window=48000)
