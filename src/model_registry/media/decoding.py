"""Decoding image and audio bytes, with limits, for the adapters' `prepare` stage.

Every failure is an `InvalidInput` that names the input's index and what was wrong, so a corrupt
upload is a 400 for its request and nothing else. Pillow and soundfile are imported lazily.
"""

from __future__ import annotations

import io
import math
import numbers
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from model_registry.errors import InvalidInput
from model_registry.types import EmbedItem, Item, Media, MediaLimits, Modality

if TYPE_CHECKING:
    from PIL.Image import Image

#: The largest decoded sample taken. Full scale is 1 (a float file may hold more, even int16's
#: range); past this, a model's spectrogram powers overflow float32 into NaN vectors.
MAX_SAMPLE = 1_000_000.0
#: Any image decoding to at most this many bytes is accepted whatever its compression (about 1.4 MP).
DECODE_FLOOR = 4 * 2**20
_RGB = 3
#: A JPEG is decoded at 1/2, 1/4 or 1/8 scale only where the model's resize still shrinks the
#: result by this much or more in each direction (pixels then within 2/255 of a full decode).
REDUCING_GAP = 2
#: The processor's resize: the (width, height) an image of (width, height) pixels becomes.
Resize = Callable[[int, int], tuple[int, int]]
#: EXIF orientations that swap width and height (transpose, the two quarter turns, transverse).
_SWAPS = frozenset({5, 6, 7, 8})


def _bad(index: int, what: str) -> InvalidInput:
    return InvalidInput(f"input {index}: {what}", param="input")


def check_image_size(width: int, height: int, encoded: int, index: int, limits: MediaLimits) -> None:
    """Refuse an image by its header: too many pixels, too extreme a shape, or too much expansion."""
    if width * height > limits.max_image_pixels:
        raise _bad(
            index,
            f"the image is {width}x{height} = {width * height:,} pixels, "
            f"more than the limit of {limits.max_image_pixels:,}",
        )
    if max(width, height) > limits.max_image_aspect_ratio * max(1, min(width, height)):
        raise _bad(
            index,
            f"the image is {width}x{height}, an aspect ratio past the limit of {limits.max_image_aspect_ratio:g}:1 "
            "(max_image_aspect_ratio); crop it to the region of interest",
        )
    decoded = width * height * _RGB
    allowed = max(limits.max_media_expansion * encoded, DECODE_FLOOR)
    if decoded > allowed:
        raise _bad(
            index,
            f"the image's {encoded:,} bytes decode to {decoded:,} bytes of pixels, more than "
            f"{limits.max_media_expansion:g} times its size (max_media_expansion); such compression "
            "is a decompression bomb, not a picture",
        )


def decode_image(
    data: bytes, index: int, limits: MediaLimits, resize: Resize | None = None, *, on_white: bool = False
) -> Image:
    """RGB image from encoded bytes, turned as its EXIF orientation says (as transformers'
    `load_image` and every viewer do); its size is checked from the header before any pixel is
    decoded. With `resize`, the model's resize, a JPEG may be decoded at a reduced scale
    (`jpeg_scale`): a 12-megapixel photo for a 224-pixel model decodes about 3 times faster into a
    sixteenth of the memory. With `on_white`, an RGBA image is laid over white by its alpha (as
    qwen-vl-utils prepares Qwen-VL's images) instead of losing its alpha."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise _bad(index, "the image is empty")
    # Pillow's own bomb check stays on: it raises past twice `Image.MAX_IMAGE_PIXELS` (and warns
    # past it); `warnings.catch_warnings` is not used because it is not thread-safe.
    try:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        check_image_size(width, height, len(data), index, limits)
        orientation = _orientation(image)
        if resize is not None and limits.scaled_jpeg and image.format == "JPEG":
            shown = (height, width) if orientation in _SWAPS else (width, height)
            scale = jpeg_scale(*shown, resize)
            if scale > 1:
                image.draft("RGB", (width // scale, height // scale))
        image.load()
        if on_white and image.mode == "RGBA":
            white = Image.new("RGB", image.size, (255, 255, 255))
            white.paste(image, mask=image.getchannel("A"))
            return _turned(white, orientation)
        # convert() copies even an RGB image: at the pixel limit that copy is 120 MB more.
        return _turned(image if image.mode == "RGB" else image.convert("RGB"), orientation)
    except InvalidInput:
        raise
    except UnidentifiedImageError:
        raise _bad(index, "the data is not an image in a supported format (JPEG, PNG, WebP, GIF, BMP...)") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise _bad(index, f"the image was refused as a decompression bomb ({error})") from None
    except (OSError, ValueError, SyntaxError, EOFError) as error:
        raise _bad(index, f"the image is corrupt or truncated ({error})") from None


def jpeg_scale(width: int, height: int, resize: Resize) -> int:
    """The reduction (8, 4, 2 or 1) a JPEG of `width` x `height` may be decoded at for `resize`.

    A reduction is taken only where it divides both sides, so the aspect ratio is kept exactly (and
    any resize computed from the sides, which a power of two scales exactly, gives the same size),
    where the model's resize still shrinks the result at least `REDUCING_GAP` times each way, and
    where `resize` gives the reduced image the very size it gives the whole one.
    """
    target = resize(width, height)
    for scale in (8, 4, 2):
        reduced = (width // scale, height // scale)
        exact = not (width % scale or height % scale)
        shrinks = all(side >= REDUCING_GAP * want for side, want in zip(reduced, target, strict=True))
        if exact and shrinks and resize(*reduced) == target:
            return scale
    return 1


def _orientation(image: Image) -> int:
    """The image's EXIF orientation (1 to 8; 1 where it has none or an unreadable one)."""
    try:
        value = image.getexif().get(0x0112, 1)  # ExifTags.Base.Orientation
    except (OSError, ValueError, SyntaxError, EOFError, KeyError, TypeError):
        return 1
    if not isinstance(value, numbers.Real):  # a SHORT as cameras write it, or a RATIONAL 6/1 or DOUBLE 6.0
        return 1
    number = float(value)
    return int(number) if number.is_integer() and 1 <= number <= 8 else 1


def _turned(image: Image, orientation: int) -> Image:
    """`image` as its EXIF orientation says it is shown."""
    from PIL.Image import Transpose

    method = {
        2: Transpose.FLIP_LEFT_RIGHT,
        3: Transpose.ROTATE_180,
        4: Transpose.FLIP_TOP_BOTTOM,
        5: Transpose.TRANSPOSE,
        6: Transpose.ROTATE_270,
        7: Transpose.TRANSVERSE,
        8: Transpose.ROTATE_90,
    }.get(orientation)
    return image if method is None else image.transpose(method)


def shortest_edge_resize(edge: int) -> Resize:
    """The resize of CLIP-style processors: the shortest side to `edge`, the other in proportion
    (truncated, as transformers and torchvision both compute it)."""

    def resize(width: int, height: int) -> tuple[int, int]:
        if width <= height:
            return edge, int(edge * height / width)
        return int(edge * width / height), edge

    return resize


def fixed_resize(width: int, height: int) -> Resize:
    """A resize to `width` x `height` whatever the image's shape (SigLIP, PaliGemma)."""
    return lambda _w, _h: (width, height)


def crop_for_center_crop(image: Image, shortest_edge: int, crop_width: int, crop_height: int) -> Image:
    """The part of `image` that "resize the shortest edge to `shortest_edge`, then center-crop" keeps.

    Such a processor resizes the whole image first: a 100,000 x 1 strip becomes 3,200,000 x 32
    floats before the crop throws nearly all of it away. Cropping the centre first, to twice the
    crop plus a margin for the resampling filter, gives the same pixels to within rounding of the
    resize (the shortest edge is never cut, so the scale is unchanged) at a bounded cost.
    """
    width, height = image.size
    short = min(width, height)
    scale = short / shortest_edge  # source pixels per output pixel
    margin = math.ceil(3 * scale) + 2  # bicubic reaches two output pixels each side; one spare
    if width >= height:
        keep = min(width, max(short, math.ceil(2 * crop_width * scale) + 2 * margin))
        keep += (width - keep) % 2  # same parity: the kept strip is centred exactly
        left = (width - keep) // 2
        return image if keep >= width else image.crop((left, 0, left + keep, height))
    keep = min(height, max(short, math.ceil(2 * crop_height * scale) + 2 * margin))
    keep += (height - keep) % 2
    top = (height - keep) // 2
    return image if keep >= height else image.crop((0, top, width, top + keep))


@contextmanager
def processing(index: int, what: str) -> Iterator[None]:
    """A model processor's refusal of one input (odd size, bad mode...) as a 400 naming that input."""
    try:
        yield
    except InvalidInput:
        raise
    except (ValueError, OSError, ZeroDivisionError, IndexError) as error:
        raise _bad(index, f"the {what} cannot be processed by the model's processor ({error})") from None


def decode_audio(data: bytes, index: int, rate: int, limits: MediaLimits, window: int | None = None) -> np.ndarray:
    """Mono float32 samples at `rate` Hz: the first `window` of them (at `rate`) or the whole clip.

    From the header, before any sample is decoded: the duration against `max_audio_seconds`, and
    both channels x frames to be read and the samples they resample to against `max_audio_samples`
    (a clip at 10 Hz holds few frames but resamples to thousands of times as many). Only the frames
    the window needs (plus the resampler's margin) are read and resampled, never the rest of the clip.
    """
    import soundfile

    if not data:
        raise _bad(index, "the audio is empty")
    check_wav_header(data, index)
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as handle:
            native_rate, channels = handle.samplerate, handle.channels
            if native_rate <= 0 or channels <= 0:
                raise _bad(index, f"the audio header declares {channels} channels at {native_rate} Hz")
            declared = handle.frames / native_rate
            if declared > limits.max_audio_seconds:
                raise _bad(index, _too_long(declared, limits))
            # Never trust the header's length: read at most the limit plus one frame.
            cap = int(limits.max_audio_seconds * native_rate) + 1
            if window is not None:
                cap = min(cap, _frames_for(window, rate, native_rate))
            check_audio_samples(channels, native_rate, min(cap, max(handle.frames, 1)), rate, index, limits)
            samples = handle.read(frames=cap, dtype="float32", always_2d=True)
    except InvalidInput:
        raise
    except (soundfile.LibsndfileError, RuntimeError, ValueError, OSError, EOFError) as error:
        raise _bad(index, f"the audio cannot be decoded (WAV, FLAC, OGG and MP3 are supported): {error}") from None
    if samples.shape[0] == 0:
        raise _bad(index, "the audio has no samples")
    if samples.shape[0] / native_rate > limits.max_audio_seconds:
        raise _bad(index, _too_long(samples.shape[0] / native_rate, limits))
    check_resampled(samples.shape[0], native_rate, rate, index, limits)
    if not np.isfinite(samples).all():
        raise _bad(index, "the audio holds non-finite samples")
    peak = float(np.abs(samples).max())
    if peak > MAX_SAMPLE:
        raise _bad(index, f"the audio's samples reach {peak:.3g}; decoded samples must lie within ±{MAX_SAMPLE:,.0f}")
    mono = samples.mean(axis=1, dtype=np.float32)
    out = resample(mono, native_rate, rate)
    return out if window is None else out[:window]


def _frames_for(window: int, rate: int, native_rate: int) -> int:
    """Native frames that cover `window` samples at `rate`, with a margin for the resampling filter."""
    needed = math.ceil(window * native_rate / rate)
    return needed + max(256, needed // 100)


def check_audio_samples(
    channels: int, native_rate: int, frames: int, rate: int, index: int, limits: MediaLimits
) -> None:
    """Refuse `frames` of `channels` whose samples, as read or as resampled to `rate`, pass the limit."""
    if channels * frames > limits.max_audio_samples:
        raise _bad(
            index,
            f"the audio would decode to {channels} channels x {frames:,} frames at {native_rate:,} Hz = "
            f"{channels * frames:,} samples, more than the limit of {limits.max_audio_samples:,} (max_audio_samples)",
        )
    check_resampled(frames, native_rate, rate, index, limits)


def check_resampled(frames: int, native_rate: int, rate: int, index: int, limits: MediaLimits) -> None:
    """Refuse, before resampling, frames that would resample to more than `max_audio_samples`."""
    resampled = math.ceil(frames * rate / native_rate)
    if resampled > limits.max_audio_samples:
        raise _bad(
            index,
            f"the audio's {frames:,} frames at {native_rate:,} Hz would resample to {resampled:,} samples at "
            f"{rate:,} Hz, more than the limit of {limits.max_audio_samples:,} (max_audio_samples)",
        )


_UNKNOWN_SIZES = (0, 0xFFFFFFFF)  # streaming writers leave the size open; that is not a lie


def check_wav_header(data: bytes, index: int) -> None:
    """A WAV whose `data` chunk claims more bytes than the file holds is truncated or forged.

    libsndfile quietly trusts the file size instead; a server should say the upload is broken.
    """
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return
    position = 12
    while position + 8 <= len(data):
        chunk, size = data[position : position + 4], int.from_bytes(data[position + 4 : position + 8], "little")
        if chunk == b"data":
            held = len(data) - position - 8
            if size not in _UNKNOWN_SIZES and size > held:
                raise _bad(
                    index,
                    f"the WAV header declares {size:,} bytes of audio but the file holds {held:,}: "
                    "it is truncated or its header is wrong",
                )
            return
        position += 8 + size + (size & 1)


def _too_long(seconds: float, limits: MediaLimits) -> str:
    return f"the audio lasts {seconds:.1f}s, longer than the limit of {limits.max_audio_seconds:g}s"


def resample(samples: np.ndarray, source_rate: int, target_rate: int) -> np.ndarray:
    if source_rate == target_rate:
        return samples
    import soxr

    out: np.ndarray = soxr.resample(samples, source_rate, target_rate, quality="HQ").astype(np.float32)
    return out


def media_of(index: int, item: Item, allowed: frozenset[Modality]) -> Media | None:
    """The item's media (None for text), or `InvalidInput` when the model cannot take its modality."""
    if not isinstance(item, EmbedItem):
        raise InvalidInput(f"input {index}: this model embeds inputs, it cannot take {type(item).__name__}")
    content: Any = item.content
    if not isinstance(content, Media):
        return None
    if content.modality not in allowed:
        accepted = ", ".join(sorted(m.value for m in allowed)) or "text"
        raise _bad(index, f"this model cannot embed {content.modality.value}; it takes {accepted} and text")
    return content
