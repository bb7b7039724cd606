"""Output encodings for dense and multi-vector output: float or base64, and the embedding dtypes.

The dtypes follow sentence-transformers' `quantize_embeddings`:
- `float32`: unchanged;
- `int8` / `uint8`: each dimension's range split into 256 buckets, `floor((x - start) / step)`
  clipped to [0, 255] (minus 128 for int8). The range is [-1, 1] for every dimension when all values
  lie in it (normalised vectors), else [-m, m] with m the largest magnitude in the request, so a
  vector's code never depends on which other vectors share its request when it is normalised;
- `binary` / `ubinary`: the sign bits (x > 0) packed 8 to a byte, big-endian bit order
  (`numpy.packbits`); `binary` stores each byte minus 128 as int8.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np

EmbeddingType = Literal["float32", "int8", "uint8", "binary", "ubinary"]
EncodingFormat = Literal["float", "base64"]
EMBEDDING_TYPES: tuple[str, ...] = ("float32", "int8", "uint8", "binary", "ubinary")


def quantization_ranges(arrays: list[np.ndarray]) -> np.ndarray:
    """(2, d) per-dimension [start, end] used for int8/uint8 over all `arrays` of one request."""
    width = arrays[0].shape[-1]
    largest = max((float(np.abs(a).max()) for a in arrays if a.size), default=1.0)
    bound = 1.0 if largest <= 1.0 else largest
    return np.vstack((np.full(width, -bound, np.float32), np.full(width, bound, np.float32)))


def quantize(array: np.ndarray, dtype: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """`array` (d,) or (n, d) float32 in `dtype`; `ranges` is needed for int8/uint8."""
    if dtype == "float32":
        same: np.ndarray = np.asarray(array, dtype=np.float32)
        return same
    if dtype in ("int8", "uint8"):
        assert ranges is not None, "This is a bug: int8/uint8 quantization needs ranges"
        starts = ranges[0]
        steps = (ranges[1] - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        buckets: np.ndarray = np.clip(np.floor((array - starts) / steps), 0, 255)
        return (buckets - 128).astype(np.int8) if dtype == "int8" else buckets.astype(np.uint8)
    packed = np.packbits(array > 0, axis=-1)
    if dtype == "binary":
        return (packed.astype(np.int16) - 128).astype(np.int8)
    if dtype == "ubinary":
        return packed
    raise ValueError(f"unknown embedding type '{dtype}'")


def encode_array(array: np.ndarray, encoding_format: str) -> Any:
    """A (quantized) array as JSON numbers (nested for 2-d) or base64 of its little-endian bytes."""
    if encoding_format == "base64":
        raw = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
        return base64.b64encode(raw).decode("ascii")
    if array.dtype == np.float32:
        return array
    return array.tolist()


def encode_vectors(arrays: list[np.ndarray], dtype: str, encoding_format: str) -> list[Any]:
    """Quantize and encode one request's vectors (or matrices) with one shared int8/uint8 range."""
    ranges = quantization_ranges(arrays) if dtype in ("int8", "uint8") and arrays else None
    return [encode_array(quantize(a, dtype, ranges), encoding_format) for a in arrays]
