"""Output encodings: the embedding dtypes equal sentence-transformers' `quantize_embeddings`."""

from __future__ import annotations

import asyncio
import base64
import threading

import numpy as np
import pytest

from infinity_server.encoding import (
    OFF_LOOP_NUMBERS,
    dense_vectors,
    dump_json,
    encode_vectors,
    quantization_ranges,
    quantize,
    sparse_entry,
)
from model_registry import BatchFailed, Embedding, Results, SparseVector


@pytest.fixture
def vectors() -> np.ndarray:
    rng = np.random.default_rng(0)
    matrix = rng.standard_normal((6, 20)).astype(np.float32)
    normalised: np.ndarray = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    return normalised


@pytest.mark.parametrize("dtype", ["float32", "int8", "uint8", "binary", "ubinary"])
def test_quantize_equals_sentence_transformers(vectors: np.ndarray, dtype: str) -> None:
    from sentence_transformers.util.quantization import quantize_embeddings

    ranges = quantization_ranges([vectors])
    expected = quantize_embeddings(vectors, precision=dtype, ranges=ranges)  # type: ignore[arg-type]
    got = quantize(vectors, dtype, ranges)
    assert isinstance(expected, np.ndarray)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_normalised_vectors_get_codes_independent_of_their_request(vectors: np.ndarray) -> None:
    together = encode_vectors(list(vectors), "int8", "float")
    alone = [encode_vectors([row], "int8", "float")[0] for row in vectors]
    assert together == alone


def test_large_values_share_one_range_per_request() -> None:
    rows = [np.array([4.0, -2.0, 0.0], np.float32), np.array([1.0, 0.5, -4.0], np.float32)]
    codes = encode_vectors(rows, "uint8", "float")
    assert codes[0][0] >= 254  # the top of the shared range [-4, 4] (floor of float32 arithmetic)
    assert codes[1][2] == 0
    assert codes[0][2] in (127, 128)


def test_base64_is_little_endian_bytes(vectors: np.ndarray) -> None:
    (packed,) = encode_vectors([vectors[0]], "ubinary", "base64")
    assert base64.b64decode(packed) == np.packbits(vectors[0] > 0).tobytes()
    (floats,) = encode_vectors([vectors], "float32", "base64")
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(floats), "<f4").reshape(vectors.shape), vectors)


def _results(matrix: np.ndarray) -> Results:
    return Results(tuple(Embedding(dense=row) for row in matrix), tokens=0)


def test_dense_vectors_normalise_or_leave_alone(vectors: np.ndarray) -> None:
    scaled = vectors * 3.0
    results = _results(scaled)
    np.testing.assert_array_equal(np.stack(dense_vectors(results)), scaled)
    unit = np.stack(dense_vectors(results, normalize=True))
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-6)


def test_large_responses_are_written_off_the_event_loop() -> None:
    loop_thread: list[int] = []

    def build() -> list[int]:
        loop_thread.append(threading.get_ident())
        return [1, 2, 3]

    async def main() -> tuple[bytes, bytes]:
        small = await dump_json(build, OFF_LOOP_NUMBERS)
        large = await dump_json(build, OFF_LOOP_NUMBERS + 1)
        return small, large

    small, large = asyncio.run(main())
    assert small == large == b"[1,2,3]"
    assert loop_thread[0] == threading.get_ident()  # asyncio.run runs the loop on this thread
    assert loop_thread[1] != threading.get_ident()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_vector_holding_nan_or_infinity_is_an_error_naming_its_input(bad: float) -> None:
    rows = [np.ones(4, np.float32), np.array([0.5, bad, 0.5, 0.5], np.float32)]
    for encoding_format in ("float", "base64"):
        with pytest.raises(BatchFailed, match="output for input 1 holds NaN or infinity"):
            encode_vectors(rows, "float32", encoding_format)
    with pytest.raises(BatchFailed, match="a sparse vector"):
        sparse_entry(SparseVector(np.array([3]), np.array([bad], np.float32)), with_tokens=False)
