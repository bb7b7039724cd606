"""Vision-language models are refused, never served as text models: Qwen3-VL-Embedding as published
(Qwen3VLForConditionalGeneration with sentence-transformers modules that last-token pool it) and
Qwen3-VL-Reranker (no modules), with no `kind`, and with a `kind` that would read them as text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.builders.text import st_layout

pytestmark = pytest.mark.integration


def qwen3_vl(root: Path, *, modules: bool) -> Path:
    """Qwen3-VL's config.json as published (text and vision configs), at a tiny size."""
    from transformers import Qwen3VLConfig

    text = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    vision = {"hidden_size": 32, "intermediate_size": 64, "depth": 2, "num_heads": 2, "out_hidden_size": 32}
    config = Qwen3VLConfig(text_config=text, vision_config=vision)
    config.architectures = ["Qwen3VLForConditionalGeneration"]
    config.save_pretrained(root)
    if modules:
        st_layout(root, pooling="lasttoken", hidden=32, normalize=True, max_seq_length=64)
    return root


@pytest.mark.parametrize(
    ("name", "modules", "kind"),
    [
        ("embedding", True, None),
        ("embedding", True, "dense"),
        ("reranker", False, None),
        ("reranker", False, "reranker"),
    ],
)
def test_a_vision_language_model_is_refused_naming_what_it_is(
    serve: Any, tmp_path: Path, name: str, modules: bool, kind: str | None
) -> None:
    directory = qwen3_vl(tmp_path / name, modules=modules)
    entry = {"name": "vl", "source": str(directory), **({"kind": kind} if kind else {})}
    live = serve({"models": [entry]})
    with live.client() as client:
        embedded = client.post("/v1/embeddings", json={"model": "vl", "input": ["a cat"]})
        ranked = client.post("/rerank", json={"model": "vl", "query": "a cat", "documents": ["a cat", "a dog"]})
        assert client.get("/health").status_code == 200
    for answer in (embedded, ranked):
        assert answer.status_code == 503, answer.text
        message = answer.json()["error"]["message"]
        assert "vision-language model" in message
        assert "Qwen3VLForConditionalGeneration" in message
