"""Response encoding every dialect shares: vectors out of results, the Matryoshka cut, the dtypes.

Output encodings for dense and multi-vector output: float or base64, and the embedding dtypes.

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

import asyncio
import base64
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import orjson

from infinity_server.schemas.responses import SparseEntry
from model_registry import (
    Embedding,
    OutputLimit,
    Results,
    SparseVector,
    UnsupportedOperation,
    normalized,
)
from model_registry.errors import not_finite

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
    """Quantize and encode one request's vectors (or matrices) with one shared int8/uint8 range.
    A vector holding NaN or infinity is a 500 naming its input, never an answer (JSON would write
    null, base64 NaN bytes)."""
    bad = _first_not_finite(arrays)
    if bad is not None:
        raise not_finite(f"the model's output for input {bad} holds")
    ranges = quantization_ranges(arrays) if dtype in ("int8", "uint8") and arrays else None
    return [encode_array(quantize(a, dtype, ranges), encoding_format) for a in arrays]


def _first_not_finite(arrays: list[np.ndarray]) -> int | None:
    """The index of the first array holding NaN or infinity, if any."""
    return next((i for i, a in enumerate(arrays) if not np.isfinite(a).all()), None)


# ---- results -> arrays ----------------------------------------------------------------------------


def column(results: Results, name: str) -> list[Any]:
    """One output (`dense` or `multivector`) of every result; a missing one is a bug in the engine."""
    arrays = []
    for result in results.items:
        value = getattr(result, name, None) if isinstance(result, Embedding) else None
        if value is None:
            raise UnsupportedOperation(f"This is a bug: the model returned no {name} output")
        arrays.append(value)
    return arrays


def dense_matrix(results: Results) -> np.ndarray:
    """The dense vectors of `results` as one (n, d) float32 matrix."""
    return np.stack(column(results, "dense"))


def dense_vectors(results: Results, *, normalize: bool = False) -> list[np.ndarray]:
    """The dense vectors of `results` (a `dimensions` cut is the engine's: `embed`), normalised if asked."""
    matrix = dense_matrix(results)
    return list(normalized(matrix) if normalize else matrix)


def sparse_entry(vector: SparseVector, with_tokens: bool) -> SparseEntry:
    """`{indices, values}` (and `tokens`) of one sparse vector."""
    if _first_not_finite([np.asarray(vector.values)]) is not None:
        raise not_finite("the model's output for a sparse vector holds")
    entry: SparseEntry = {"indices": np.asarray(vector.indices, dtype=np.int64), "values": vector.values}
    if with_tokens:
        entry["tokens"] = list(vector.tokens or ())
    return entry


# ---- JSON, off the event loop when large ----------------------------------------------------------

#: Above this many numbers in a response, quantizing, base64 and JSON run on a worker thread: a
#: ColPali page is ~1000 x 128 numbers, and writing a batch of them would stall every other request.
OFF_LOOP_NUMBERS = 1 << 16
_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def numbers_in(results: Results) -> int:
    """How many numbers the vectors of `results` hold (the cost of writing them)."""
    total = 0
    for result in results.items:
        if isinstance(result, Embedding):
            for array in (result.dense, result.multivector):
                total += 0 if array is None else int(array.size)
            total += 0 if result.sparse is None else 2 * len(result.sparse.indices)
    return total


async def dump_json(build: Callable[[], Any], numbers: int) -> bytes:
    """`orjson.dumps(build())`, on a worker thread when the response holds more than `OFF_LOOP_NUMBERS`."""
    if numbers <= OFF_LOOP_NUMBERS:
        return orjson.dumps(build(), option=_JSON_OPTIONS)
    return await asyncio.to_thread(lambda: orjson.dumps(build(), option=_JSON_OPTIONS))


# ---- the answer's size, in the request's encoding -------------------------------------------------

#: Bytes per number written as JSON, by embedding type: about 12 for a float32 of a normalised
#: vector (orjson, measured), the digits and comma of an int8 or uint8, a byte's for 8 binary ones.
_JSON_BYTES = {"float32": 12.0, "int8": 5.0, "uint8": 4.0, "binary": 5 / 8, "ubinary": 4 / 8}
#: Raw bytes per number, by embedding type; base64 writes 4 characters for every 3 of them.
_RAW_BYTES = {"float32": 4.0, "int8": 1.0, "uint8": 1.0, "binary": 1 / 8, "ubinary": 1 / 8}


def output_limit(max_bytes: int, embedding_type: str = "float32", encoding_format: str = "float") -> OutputLimit:
    """`server.max_output_bytes` for an answer of `embedding_type` numbers written as `encoding_format`,
    which the registry checks against its estimate of the answer before any work."""
    if encoding_format == "base64":
        return OutputLimit(max_bytes, _RAW_BYTES[embedding_type] * 4 / 3, f"{embedding_type} in base64")
    return OutputLimit(max_bytes, _JSON_BYTES[embedding_type], f"{embedding_type} in JSON")
