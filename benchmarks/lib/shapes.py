"""Random-weight models of published models' shapes, for speed benchmarks: a forward pass costs the
same whatever its weights' values, so a model of the right shape needs no download.

    build("qwen3-0.6b", directory) -> directory

writes `config.json` and `model.safetensors` (bfloat16) into `directory`, which the torch engine
loads as it loads the published model; there is no tokenizer (the benchmarks send token ids).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Shape name -> the published config.json's fields that set the cost of a forward pass.
SHAPES: dict[str, dict[str, Any]] = {
    # Qwen/Qwen3-Embedding-0.6B: a decoder embedder, pooled on its last token.
    "qwen3-0.6b": {
        "model_type": "qwen3",
        "architectures": ["Qwen3Model"],
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 3072,
        "vocab_size": 151669,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000,
        "rms_norm_eps": 1e-06,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
    },
}


def config(shape_name: str, layers: int | None = None) -> Any:
    """The transformers config of `shape_name` (`layers`: fewer layers, for a quick check)."""
    from transformers import AutoConfig

    if shape_name not in SHAPES:
        raise ValueError(f"unknown shape {shape_name!r}; known: {', '.join(sorted(SHAPES))}")
    fields = dict(SHAPES[shape_name])
    if layers is not None:
        fields["num_hidden_layers"] = layers
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def build(shape_name: str, directory: Path, *, layers: int | None = None, seed: int = 0, device: str = "cpu") -> Path:
    """A model of `shape_name`'s shape with random weights (seeded), saved into `directory`;
    `device` is where the weights are drawn (a GPU draws 0.6B of them in a moment)."""
    import torch
    from transformers import AutoModel

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModel.from_config(config(shape_name, layers), dtype=torch.bfloat16)
    model.save_pretrained(directory)
    return directory
