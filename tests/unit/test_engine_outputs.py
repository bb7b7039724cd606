"""What the adapters take from an engine: numpy arrays, torch tensors and ONNX Runtime's values
(DLPack), without a copy; SPLADE's pooling of half-precision logits, a few rows at a time."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model_registry.adapters import splade
from model_registry.adapters.dense import as_tensor
from model_registry.adapters.splade import splade_pool


def test_numpy_arrays_and_tensors_are_taken_without_a_copy() -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensor = as_tensor(array)
    assert tensor.data_ptr() == array.ctypes.data
    assert as_tensor(tensor).data_ptr() == tensor.data_ptr()
    assert as_tensor(array, "cpu").data_ptr() == array.ctypes.data


def test_an_onnxruntime_output_left_where_it_was_computed_is_taken_through_dlpack() -> None:
    """The CUDA path's shape on the CPU: an output bound by IO binding, read back as an `OrtValue`
    (not copied into numpy), taken by torch without a copy and equal to what `run` returns."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "x"], ["y"])],
        "square",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]], dtype=np.float32)
    binding = session.io_binding()
    binding.bind_cpu_input("x", x)
    binding.bind_output("y", "cpu")
    session.run_with_iobinding(binding)
    value = binding.get_outputs()[0]
    assert not isinstance(value, np.ndarray)
    tensor = as_tensor(value)
    assert tensor.data_ptr() == value.data_ptr()
    np.testing.assert_array_equal(tensor.numpy(), x * x)
    np.testing.assert_array_equal(tensor.numpy(), session.run(["y"], {"x": x})[0])


@pytest.mark.parametrize("strategy", ["max", "sum"])
@pytest.mark.parametrize("widened", [1 << 24, 2 * 5 * 11, 5 * 11])
def test_half_precision_logits_pool_like_their_float32_values(
    monkeypatch: pytest.MonkeyPatch, strategy: str, widened: int
) -> None:
    """Whole, two rows and one row at a time: the same float32 weights as the formula on the
    half-precision values, padding excluded."""
    monkeypatch.setattr(splade, "_WIDENED", widened)
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(5, 5, 11, generator=generator) * 3).half()
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]])
    values = torch.log1p(torch.clamp(logits.float(), min=0)) * mask.unsqueeze(-1)
    expected = values.sum(dim=1) if strategy == "sum" else values.amax(dim=1)
    original = logits.clone()
    pooled = splade_pool(logits, mask, strategy)
    assert pooled.dtype == torch.float32
    torch.testing.assert_close(logits, original, rtol=0, atol=0)  # the engine's output is left as it was
    torch.testing.assert_close(pooled, expected, rtol=1e-6, atol=1e-6)
