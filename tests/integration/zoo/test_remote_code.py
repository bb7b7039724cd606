"""Checkpoints whose code lives outside the libraries: refused unless trusted, then run as their code says.

The model here is a BERT subclass with one extra weight (a per-feature scale on the hidden
states), named by config.json's `auto_map` like jina-embeddings-v3's XLMRobertaLoRA: loaded as
plain BERT it would ignore that weight and answer 200 with other vectors. The reference is
transformers' own `AutoModel` with `trust_remote_code=True` on the same directory, pooled here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.builders.hub import lay_out_cache
from tests.builders.text import tiny_bert

pytestmark = pytest.mark.integration

SENTENCES = ["a cat sleeps on the mat", "the stock market fell", "two dogs run in the snow"]
CLASS = "modeling_scaled.ScaledBertModel"
MODELING = '''
import torch
from transformers import BertModel


class ScaledBertModel(BertModel):
    """BERT whose hidden states are scaled per feature by a weight of its own."""

    def __init__(self, config):
        super().__init__(config)
        self.feature_scale = torch.nn.Parameter(torch.ones(config.hidden_size))

    def forward(self, *args, **kwargs):
        output = super().forward(*args, **kwargs)
        output["last_hidden_state"] = output["last_hidden_state"] * self.feature_scale
        return output
'''


def tiny_remote_code_model(root: Path, *, auto_map: str = CLASS, custom_st: bool = False) -> Path:
    """A tiny BERT in the sentence-transformers layout whose config names its own model class."""
    from safetensors.torch import load_file, save_file

    tiny_bert(root)
    weights = load_file(root / "model.safetensors")
    generator = torch.Generator().manual_seed(1)
    weights["feature_scale"] = torch.rand(32, generator=generator) * 3 + 0.5
    save_file(weights, root / "model.safetensors", metadata={"format": "pt"})
    (root / "modeling_scaled.py").write_text(MODELING)
    config = json.loads((root / "config.json").read_text())
    config.update(architectures=["ScaledBertModel"], auto_map={"AutoModel": auto_map})
    (root / "config.json").write_text(json.dumps(config))
    if custom_st:
        modules = json.loads((root / "modules.json").read_text())
        modules[0]["type"] = "custom_st.Transformer"
        (root / "modules.json").write_text(json.dumps(modules))
        (root / "custom_st.py").write_text("from sentence_transformers.models import Transformer  # noqa\n")
    return root


def reference(directory: Path) -> np.ndarray:
    """transformers running the checkpoint's own class, mean pooled and normalized here."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModel.from_pretrained(str(directory), trust_remote_code=True).eval()
    assert type(model).__name__ == "ScaledBertModel"
    rows = []
    with torch.inference_mode():
        for sentence in SENTENCES:
            ids = tokenizer(sentence, return_tensors="pt")
            hidden = model(**ids).last_hidden_state[0]
            pooled = hidden.mean(dim=0)
            rows.append((pooled / pooled.norm()).numpy())
    return np.stack(rows)


def embed(client: Any, inputs: list[str]) -> Any:
    return client.post("/v1/embeddings", json={"model": "remote", "input": inputs})


def entry(directory: Path, **extra: Any) -> dict[str, Any]:
    return {"name": "remote", "source": str(directory), "backend": "torch", **extra}


@pytest.mark.parametrize("custom_st", [False, True])
def test_code_outside_the_libraries_is_refused_without_trust(serve: Any, tmp_path: Path, custom_st: bool) -> None:
    directory = tiny_remote_code_model(tmp_path / "remote", custom_st=custom_st)
    live = serve({"models": [entry(directory)]})
    with live.client() as client:
        answer = embed(client, SENTENCES[:1])
        assert answer.status_code == 503, answer.text
        message = answer.json()["error"]["message"]
        assert "trust_remote_code: true" in message
        assert CLASS in message
        if custom_st:
            assert "custom_st.Transformer" in message
        assert client.get("/health").status_code == 200


@pytest.mark.parametrize("custom_st", [False, True])
def test_trusted_code_in_the_model_directory_runs_as_transformers_runs_it(
    serve: Any, tmp_path: Path, custom_st: bool
) -> None:
    directory = tiny_remote_code_model(tmp_path / "remote", custom_st=custom_st)
    expected = reference(directory)
    live = serve({"models": [entry(directory, trust_remote_code=True)]})
    with live.client() as client:
        answer = embed(client, SENTENCES)
        assert answer.status_code == 200, answer.text
        single = [embed(client, [s]).json()["data"][0]["embedding"] for s in SENTENCES]
        details = {m["id"]: m for m in client.get("/v1/models").json()["data"]}["remote"]["details"]
    got = np.asarray([row["embedding"] for row in answer.json()["data"]])
    np.testing.assert_allclose(got, expected, atol=1e-4)
    np.testing.assert_allclose(single, got, atol=1e-5)
    assert CLASS in details["code"]


def test_trusted_code_missing_offline_names_where_it_was_looked_for(
    serve: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """jina-embeddings-v3's layout: auto_map into another hub repository, not in the local cache."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    lay_out_cache(tmp_path / "cache", "org/other-code", "c0ffee")  # cached, but without the module
    directory = tiny_remote_code_model(tmp_path / "remote", auto_map=f"org/implementation--{CLASS}")
    live = serve({"models": [entry(directory, trust_remote_code=True)]})
    with live.client() as client:
        answer = embed(client, SENTENCES[:1])
        assert answer.status_code == 503, answer.text
        message = answer.json()["error"]["message"]
        assert f"org/implementation--{CLASS}" in message
        assert "HF_HUB_OFFLINE" in message


@pytest.mark.parametrize(
    ("model_type", "architecture", "auto_map"),
    [
        ("nomic_bert", "NomicBertModel", "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel"),
        ("jina_embeddings_v3", "JinaEmbeddingsV3Model", None),
    ],
)
def test_a_family_with_a_native_port_runs_transformers_code_without_trust(
    tmp_path: Path, model_type: str, architecture: str, auto_map: str | None
) -> None:
    """nomic-embed-text-v1.5 names hub code in auto_map, jina-embeddings-v3-hf none: transformers'
    own port serves each, and /models says so."""
    from model_registry.config import ModelSpec
    from model_registry.detection.layout import detect

    config: dict[str, Any] = {"model_type": model_type, "architectures": [architecture]}
    if auto_map:
        config["auto_map"] = {"AutoModel": auto_map}
    (tmp_path / "config.json").write_text(json.dumps(config))
    for trusted in (False, True):
        layout = detect(tmp_path, ModelSpec(name="port", source=str(tmp_path), trust_remote_code=trusted))
        assert not layout.remote_code
        assert f"native {model_type} port" in layout.notes["code"]


def test_trusted_code_of_another_repository_is_found_in_the_local_hub_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """jina-embeddings-v3's auto_map points into jinaai/xlm-roberta-flash-implementation: cached, it passes."""
    from model_registry.errors import ModelUnavailable
    from model_registry.zoo.files import check_remote_code

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    reference = f"org/implementation--{CLASS}"
    with pytest.raises(ModelUnavailable, match="HF_HUB_OFFLINE"):
        check_remote_code([tmp_path], [reference], trusted=True)
    snapshot = lay_out_cache(tmp_path / "cache", "org/implementation", "c0ffee")
    (snapshot / "modeling_scaled.py").write_text(MODELING)
    check_remote_code([tmp_path], [reference], trusted=True)
