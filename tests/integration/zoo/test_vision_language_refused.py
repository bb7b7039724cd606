"""Vision-language models no family serves are refused, never served as text models: Qwen3-VL's
files with no sentence-transformers modules and no `kind` (Qwen3-VL-Reranker's and the chat
models' alike: the refusal says to set `kind: reranker`), Qwen3-VL-Embedding's files asked to be a
reranker, and Qwen2.5-VL whatever its `kind`. Qwen3-VL-Embedding and, with `kind: reranker`,
Qwen3-VL-Reranker are served (`test_qwen3_vl_embedding.py`, `test_qwen3_vl_reranker.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.builders.text import st_layout

pytestmark = pytest.mark.integration


def qwen3_vl(root: Path, *, modules: bool, generation: str = "3") -> Path:
    """Qwen3-VL's config.json as published (text and vision configs), at a tiny size; or, with
    `generation="2.5"`, Qwen2.5-VL's."""
    from transformers import Qwen2_5_VLConfig, Qwen3VLConfig

    text = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    vision = {"hidden_size": 32, "intermediate_size": 64, "depth": 2, "num_heads": 2, "out_hidden_size": 32}
    if generation == "2.5":
        config: Any = Qwen2_5_VLConfig(text_config=text, vision_config=vision)
        config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    else:
        config = Qwen3VLConfig(text_config=text, vision_config=vision)
        config.architectures = ["Qwen3VLForConditionalGeneration"]
    config.save_pretrained(root)
    if modules:
        st_layout(root, pooling="lasttoken", hidden=32, normalize=True, max_seq_length=64)
    return root


@pytest.mark.parametrize(
    ("name", "modules", "kind", "generation"),
    [
        ("reranker", False, None, "3"),
        ("embedding", True, "reranker", "3"),
        ("qwen2.5", True, None, "2.5"),
        ("qwen2.5", True, "dense", "2.5"),
    ],
)
def test_a_vision_language_model_is_refused_naming_what_it_is(
    serve: Any, tmp_path: Path, name: str, modules: bool, kind: str | None, generation: str
) -> None:
    directory = qwen3_vl(tmp_path / name, modules=modules, generation=generation)
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
        assert (
            "Qwen2_5_VLForConditionalGeneration" if generation == "2.5" else "Qwen3VLForConditionalGeneration"
        ) in message
        if name == "reranker":  # nothing in its files says it reranks: the entry must
            assert "`kind: reranker`" in message
