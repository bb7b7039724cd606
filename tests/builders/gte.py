"""A tiny random gte-multilingual in its published layout (Alibaba-NLP/gte-multilingual-base).

config.json says `model_type: "new"` with `auto_map` into Alibaba-NLP/new-impl's hub code; the
weights carry new-impl's names (`encoder.layer.N.attention.qkv_proj`, `mlp.up_gate_proj`,
`attn_ln`, `mlp_ln`); sentence-transformers modules pool the CLS token and normalize. The model
is built as transformers' `GteModel` (the reference) and its weights written under the published
names, so that what the server reads back is checked against what was built.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tests.builders.text import st_layout
from tests.builders.xlmr import unigram_tokenizer

NEW_IMPL = "Alibaba-NLP/new-impl"
#: The published config's RoPE: base 20000, fixed NTK scaling by 8.
ROPE_THETA, NTK_FACTOR = 20000.0, 8.0
HIDDEN, HEADS = 32, 2


def published_config(vocab_size: int, pad_token_id: int) -> dict[str, Any]:
    """config.json as gte-multilingual-base publishes it, at a tiny size."""
    return {
        "architectures": ["NewModel"],
        "auto_map": {
            "AutoConfig": f"{NEW_IMPL}--configuration.NewConfig",
            "AutoModel": f"{NEW_IMPL}--modeling.NewModel",
            "AutoModelForTokenClassification": f"{NEW_IMPL}--modeling.NewForTokenClassification",
        },
        "model_type": "new",
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "num_hidden_layers": 2,
        "num_attention_heads": HEADS,
        "intermediate_size": 64,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.0,
        "max_position_embeddings": 128,
        "type_vocab_size": 1,
        "layer_norm_eps": 1e-12,
        "layer_norm_type": "layer_norm",
        "logn_attention_clip1": False,
        "logn_attention_scale": False,
        "pack_qkv": True,
        "pad_token_id": pad_token_id,
        "position_embedding_type": "rope",
        "rope_scaling": {"factor": NTK_FACTOR, "type": "ntk"},
        "rope_theta": ROPE_THETA,
        "unpad_inputs": False,
        "use_memory_efficient_attention": False,
        "torch_dtype": "float32",
    }


def reference_model(vocab_size: int, pad_token_id: int, seed: int = 0) -> Any:
    """transformers' GteModel with new-impl's fixed NTK RoPE, random weights."""
    from transformers import GteConfig, GteModel

    torch.manual_seed(seed)
    head_dim = HIDDEN // HEADS
    rope = {"rope_type": "linear", "rope_theta": ROPE_THETA * NTK_FACTOR, "factor": NTK_FACTOR ** (2 / head_dim)}
    config = GteConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=pad_token_id,
        rope_parameters=rope,
    )
    model = GteModel(config).eval()
    with torch.no_grad():  # layer norms away from their initial identity, so that they count
        for name, weight in model.named_parameters():
            if "LayerNorm" in name or "layernorm" in name:
                weight.add_(torch.randn_like(weight) * 0.2)
    return model


def published_weights(model: Any) -> dict[str, torch.Tensor]:
    """GteModel's state dict under new-impl's names: q, k, v packed, up before gate."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out = {k: v for k, v in state.items() if k.startswith("embeddings.")}
    for i in range(model.config.num_hidden_layers):
        old, new = f"layers.{i}.", f"encoder.layer.{i}."
        for part in ("weight", "bias"):
            out[f"{new}attention.qkv_proj.{part}"] = torch.cat(
                [state[f"{old}self_attn.{p}_proj.{part}"] for p in ("q", "k", "v")]
            )
            out[f"{new}attention.o_proj.{part}"] = state[f"{old}self_attn.o_proj.{part}"]
            out[f"{new}attn_ln.{part}"] = state[f"{old}post_attention_layernorm.{part}"]
            out[f"{new}mlp_ln.{part}"] = state[f"{old}post_mlp_layernorm.{part}"]
            out[f"{new}mlp.down_proj.{part}"] = state[f"{old}mlp.down_proj.{part}"]
        out[f"{new}mlp.up_gate_proj.weight"] = torch.cat([state[f"{old}mlp.{p}_proj.weight"] for p in ("up", "gate")])
    return out


def tiny_gte_multilingual(root: Path, *, seed: int = 0) -> Path:
    """The published layout in `root`; the reference model is `reference_model(...)` on the same seed."""
    from safetensors.torch import save_file

    tokenizer = unigram_tokenizer()
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    pad = int(tokenizer.pad_token_id)
    model = reference_model(len(tokenizer), pad, seed)
    root.mkdir(parents=True, exist_ok=True)
    save_file(published_weights(model), root / "model.safetensors", metadata={"format": "pt"})
    (root / "config.json").write_text(json.dumps(published_config(len(tokenizer), pad), indent=2))
    tokenizer.save_pretrained(root)
    st_layout(root, pooling="cls", hidden=HIDDEN, normalize=True, max_seq_length=64)
    return root
