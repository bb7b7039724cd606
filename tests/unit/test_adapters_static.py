"""Static embedding models: what detection reads of their files, the settings they refuse, where
their memory is counted. The served vectors: tests/integration/zoo/test_static.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from model_registry.adapters.static import StaticAdapter, refused_settings
from model_registry.backends import devices
from model_registry.config import ModelSpec
from model_registry.detection.layout import Layout, detect
from model_registry.errors import ModelUnavailable
from model_registry.runtime.assembly import memory_device_of

MODEL2VEC = {"model_type": "model2vec", "architectures": ["StaticModel"], "normalize": True}
STATIC = {"idx": 0, "name": "0", "path": "0_StaticEmbedding", "type": "sentence_transformers.models.StaticEmbedding"}
NORMALIZE = {"idx": 1, "name": "1", "path": "1_Normalize", "type": "sentence_transformers.models.Normalize"}


def layout(root: Path, files: dict[str, Any], **entry: Any) -> Layout:
    root.mkdir()
    for name, content in files.items():
        (root / name).write_text(json.dumps(content))
    return detect(root, ModelSpec(name="m", source=str(root), **entry))


@pytest.mark.parametrize(
    ("config", "normalize", "max_length"),
    [
        ({}, True, 512),  # model2vec's default where config.json names none
        ({"max_length": None}, True, None),  # null: no limit
        ({"max_length": 64, "normalize": False}, False, 64),
    ],
)
def test_model2vec_reads_normalize_and_max_length_as_model2vec_does(
    tmp_path: Path, config: dict[str, Any], normalize: bool, max_length: int | None
) -> None:
    found = layout(tmp_path / "m", {"config.json": {**MODEL2VEC, **config}})
    assert (found.kind.value, found.family, found.model_type) == ("dense", "static", "model2vec")
    assert (found.normalize, found.max_length) == (normalize, max_length)


def test_the_entry_overrides_model2vec_s_settings(tmp_path: Path) -> None:
    found = layout(tmp_path / "m", {"config.json": MODEL2VEC}, normalize=False, max_length=32)
    assert (found.normalize, found.max_length) == (False, 32)


@pytest.mark.parametrize(("key", "value"), [("normalize", "yes"), ("max_length", 0), ("max_length", "512")])
def test_a_model2vec_setting_of_another_type_is_refused_naming_it(tmp_path: Path, key: str, value: Any) -> None:
    with pytest.raises(ModelUnavailable, match=f"sets {key} {value!r}"):
        layout(tmp_path / "m", {"config.json": {**MODEL2VEC, key: value}})


def test_a_static_embedding_pipeline_reads_its_module_directory_and_normalize(tmp_path: Path) -> None:
    files = {"modules.json": [STATIC, NORMALIZE], "config_sentence_transformers.json": {"similarity_fn_name": "dot"}}
    found = layout(tmp_path / "m", files)
    assert (found.family, found.model_type, found.normalize) == ("static", "static_embedding", True)
    assert found.transformer_dir == tmp_path / "m" / "0_StaticEmbedding"
    assert (found.max_length, found.similarity.value) == (None, "dot")


@pytest.mark.parametrize(
    ("entry", "refused"),
    [({"pooling": "cls"}, "pooling 'cls'"), ({"template": "qwen3-reranker"}, "template apply to LLM rerankers")],
)
def test_keys_of_other_families_are_refused(tmp_path: Path, entry: dict[str, Any], refused: str) -> None:
    with pytest.raises(ModelUnavailable, match=refused):
        layout(tmp_path / "m", {"config.json": MODEL2VEC}, **entry)


def test_engine_settings_are_refused_each_named() -> None:
    assert refused_settings("auto", "none", "auto", "auto") is None
    assert refused_settings("auto", "none", "auto", "cpu") is None
    message = refused_settings("onnx", "int8", "float16", "cuda:0", True)
    assert message is not None
    for named in ("backend: onnx", "quantize: int8", "dtype: float16", "device: cuda:0", "cuda_graphs: True"):
        assert named in message
    assert "without an engine" in message


def test_a_static_model_counts_host_memory_where_a_gpu_is_the_default_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(devices, "cuda_available", lambda: True)
    spec = ModelSpec(name="m", source=str(tmp_path / "m"))
    adapter = StaticAdapter(layout(tmp_path / "m", {"config.json": MODEL2VEC}))
    assert devices.memory_device(spec.device) == "cuda:0"
    assert memory_device_of(spec, adapter) == "cpu"
