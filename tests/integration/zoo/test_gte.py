"""gte-multilingual in its published layout, served by transformers' native gte port.

The checkpoint names Alibaba-NLP/new-impl's code (`model_type: "new"`, `auto_map`); the server
runs transformers' `GteModel` on its weights instead, without `trust_remote_code`. The reference
is the `GteModel` the builder made before writing its weights under the published names, with
CLS pooling and normalisation as the sentence-transformers modules say; its RoPE frequencies are
checked against new-impl's fixed NTK scaling written out here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.builders.gte import HEADS, HIDDEN, NTK_FACTOR, ROPE_THETA, reference_model, tiny_gte_multilingual
from tests.builders.hub import lay_out_cache

pytestmark = pytest.mark.integration

MODEL_ID = "Alibaba-NLP/gte-multilingual-base"
SENTENCES = ["a cat sleeps on the mat", "the stock market fell sharply today", "two dogs"]


def reference(directory: Path) -> np.ndarray:
    """`GteModel` as built, on each sentence alone: CLS state, L2-normalised."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = reference_model(len(tokenizer), int(tokenizer.pad_token_id))
    head_dim = HIDDEN // HEADS
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
    ntk = 1.0 / (ROPE_THETA * NTK_FACTOR) ** exponents / NTK_FACTOR ** (2 / head_dim)
    torch.testing.assert_close(model.rotary_emb.inv_freq, ntk)
    rows = []
    with torch.inference_mode():
        for sentence in SENTENCES:
            cls = model(**tokenizer(sentence, return_tensors="pt")).last_hidden_state[0, 0]
            rows.append((cls / cls.norm()).numpy())
    return np.stack(rows)


@pytest.fixture
def published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tiny model under its published id in a local hub cache."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    return tiny_gte_multilingual(lay_out_cache(tmp_path / "hub", MODEL_ID, "0123abcd"))


def embed(client: Any, inputs: list[str]) -> Any:
    return client.post("/v1/embeddings", json={"model": "gte", "input": inputs})


def test_transformers_port_reads_the_published_layout_as_it_was_built(published: Path) -> None:
    """The weights under new-impl's names load into `GteModel` whole and give the built model's states."""
    from transformers import AutoModel, AutoTokenizer

    from model_registry.config import ModelSpec
    from model_registry.detection.layout import detect

    layout = detect(published, ModelSpec(name="gte", source=str(published)))
    assert (layout.kind.value, layout.model_type, layout.pooling, layout.normalize) == ("dense", "gte", "cls", True)
    assert not layout.remote_code
    loaded, info = AutoModel.from_pretrained(str(layout.transformer_dir), output_loading_info=True)
    assert [key for part in ("missing_keys", "mismatched_keys", "unexpected_keys") for key in info[part]] == []
    tokenizer = AutoTokenizer.from_pretrained(str(published))
    built = reference_model(len(tokenizer), int(tokenizer.pad_token_id))
    ids = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.inference_mode():
        torch.testing.assert_close(loaded.eval()(**ids).last_hidden_state, built(**ids).last_hidden_state)


def test_gte_multilingual_by_its_id_serves_gte_model_without_remote_code(serve: Any, published: Path) -> None:
    expected = reference(published)
    live = serve({"models": [{"name": "gte", "source": MODEL_ID}]})
    with live.client() as client:
        answer = embed(client, SENTENCES)
        assert answer.status_code == 200, answer.text
        single = [embed(client, [s]).json()["data"][0]["embedding"] for s in SENTENCES]
        details = client.get("/v1/models/gte").json()["details"]
    got = np.asarray([row["embedding"] for row in answer.json()["data"]])
    np.testing.assert_allclose(got, expected, atol=1e-4)
    np.testing.assert_allclose(single, got, atol=1e-5)
    assert "native gte port" in details["code"]
    assert details["catalogue"] == MODEL_ID


@pytest.mark.parametrize(
    ("setting", "value"),
    [("logn_attention_scale", True), ("layer_norm_type", "rms_norm"), ("rope_scaling", {"type": "dynamic"})],
)
def test_settings_the_port_does_not_implement_are_refused_by_name(
    serve: Any, tmp_path: Path, setting: str, value: Any
) -> None:
    directory = tiny_gte_multilingual(tmp_path / "gte")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, setting: value}))
    live = serve({"models": [{"name": "gte", "source": str(directory), "backend": "torch"}]})
    with live.client() as client:
        answer = embed(client, SENTENCES[:1])
        assert answer.status_code == 503, answer.text
        message = answer.json()["error"]["message"]
        assert setting in message
        assert "gte port" in message
        assert client.get("/health").status_code == 200
