"""Decoding image and audio bytes, with limits, for the adapters' `prepare` stage.

Every failure is an `InvalidInput` that names the input's index and what was wrong, so a corrupt
upload is a 400 for its request and nothing else. Pillow and soundfile are imported lazily.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from model_registry.errors import InvalidInput, UnsupportedOperation
from model_registry.types import (
    Capability,
    Embedding,
    EmbedItem,
    Item,
    Media,
    Modality,
    Output,
    Result,
    Results,
    Score,
)

if TYPE_CHECKING:
    from PIL.Image import Image

DEFAULT_MAX_IMAGE_PIXELS = 40_000_000
DEFAULT_MAX_AUDIO_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class MediaLimits:
    """What one decoded input may hold: pixels of an image, seconds of audio."""

    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    max_audio_seconds: float = DEFAULT_MAX_AUDIO_SECONDS


def _bad(index: int, what: str) -> InvalidInput:
    return InvalidInput(f"input {index}: {what}", param="input")


def decode_image(data: bytes, index: int, limits: MediaLimits) -> Image:
    """RGB image from encoded bytes; the size is checked from the header before any pixel is decoded."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise _bad(index, "the image is empty")
    # Pillow's own bomb check stays on: it raises past twice `Image.MAX_IMAGE_PIXELS` (and warns
    # past it); `warnings.catch_warnings` is not used because it is not thread-safe.
    try:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > limits.max_image_pixels:
            raise _bad(
                index,
                f"the image is {width}x{height} = {width * height:,} pixels, "
                f"more than the limit of {limits.max_image_pixels:,}",
            )
        image.load()
        return image.convert("RGB")
    except InvalidInput:
        raise
    except UnidentifiedImageError:
        raise _bad(index, "the data is not an image in a supported format (JPEG, PNG, WebP, GIF, BMP...)") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise _bad(index, f"the image was refused as a decompression bomb ({error})") from None
    except (OSError, ValueError, SyntaxError) as error:
        raise _bad(index, f"the image is corrupt or truncated ({error})") from None


def decode_audio(data: bytes, index: int, rate: int, limits: MediaLimits) -> np.ndarray:
    """Mono float32 samples at `rate` Hz; the duration is checked from the header, then on the samples."""
    import soundfile

    if not data:
        raise _bad(index, "the audio is empty")
    check_wav_header(data, index)
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as handle:
            declared = handle.frames / handle.samplerate if handle.samplerate else 0.0
            if declared > limits.max_audio_seconds:
                raise _bad(index, _too_long(declared, limits))
            native_rate = handle.samplerate
            # Never trust the header's length: read at most the limit plus one sample.
            cap = int(limits.max_audio_seconds * native_rate) + 1
            samples = handle.read(frames=cap, dtype="float32", always_2d=True)
    except InvalidInput:
        raise
    except (soundfile.LibsndfileError, RuntimeError, ValueError, OSError) as error:
        raise _bad(index, f"the audio cannot be decoded (WAV, FLAC, OGG and MP3 are supported): {error}") from None
    if samples.shape[0] == 0:
        raise _bad(index, "the audio has no samples")
    if samples.shape[0] / native_rate > limits.max_audio_seconds:
        raise _bad(index, _too_long(samples.shape[0] / native_rate, limits))
    mono = samples.mean(axis=1, dtype=np.float32)
    if not np.isfinite(mono).all():
        raise _bad(index, "the audio holds non-finite samples")
    return resample(mono, native_rate, rate)


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


# ---- rerank of media against a text query ------------------------------------------------------


def media_rerank_outputs(model: str, capabilities: frozenset[Capability], query: str) -> tuple[Output, ...]:
    """What to embed for `Registry.rerank_media`: multi-vectors for late-interaction models, else dense."""
    if not {Capability.EMBED_IMAGE, Capability.EMBED_AUDIO} & capabilities:
        raise UnsupportedOperation(
            f"the model '{model}' does not embed images or audio; rerank media with a CLIP, CLAP or ColPali model",
            param="model",
        )
    if not isinstance(query, str) or not query.strip():
        raise InvalidInput("the query must be non-empty text", param="query")
    return (Output.MULTIVECTOR,) if Capability.MULTIVECTOR in capabilities else (Output.DENSE,)


def _array(result: Result, multivector: bool) -> np.ndarray:
    array = (result.multivector if multivector else result.dense) if isinstance(result, Embedding) else None
    assert array is not None, "This is a bug: an embedding model returned no vector for an input"
    return array


def media_scores(query: Results, documents: Results, *, multivector: bool) -> Results:
    """MaxSim (multi-vectors) or cosine (dense) of the one query against each document."""
    from model_registry.scoring import cosine, maxsim

    asked = _array(query.items[0], multivector)
    vectors = [_array(d, multivector) for d in documents.items]
    scores = [maxsim(asked, d) for d in vectors] if multivector else cosine(asked, np.stack(vectors)).tolist()
    return Results(tuple(Score(float(s)) for s in scores), query.tokens + documents.tokens)
