"""A tiny random jina-embeddings-v3 in its published layout (jinaai/jina-embeddings-v3).

config.json says `model_type: "xlm-roberta"`, `architectures: ["XLMRobertaLoRA"]` with `auto_map`
into jinaai/xlm-roberta-flash-implementation, and carries the task adapters' settings
(`lora_adaptations`, `lora_rank`, `lora_alpha`, `task_instructions`). The weights carry that
code's names: every linear and embedding layer of the encoder is a torch parametrization, its
weight under `...parametrizations.weight.original` and one LoRA pair per task stacked in
`...parametrizations.weight.0.lora_A` and `lora_B`. The base is built as transformers'
`JinaEmbeddingsV3Model` and written under those names, so that what the server reads back is
checked against what was built.

The LoRA formula, as the published code defines it, with s = lora_alpha / lora_rank:
a linear layer's weight (out, in) becomes W + s * B[t] @ A[t], A (tasks, rank, in) and
B (tasks, out, rank); an embedding's table (rows, dim) becomes W + s * A[t] @ B[t], A (tasks,
rows, rank) and B (tasks, rank, dim).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tests.builders.text import st_layout
from tests.builders.xlmr import unigram_tokenizer

IMPLEMENTATION = "jinaai/xlm-roberta-flash-implementation"
TASKS = ("retrieval.query", "retrieval.passage", "separation", "classification", "text-matching")
INSTRUCTIONS = {
    "retrieval.query": "Represent the query for retrieving evidence documents: ",
    "retrieval.passage": "Represent the document for retrieval: ",
    "separation": "",
    "classification": "",
    "text-matching": "",
}
ROPE_THETA = 20000.0
HIDDEN, HEADS, LAYERS, INTERMEDIATE = 32, 2, 2, 64
RANK, ALPHA = 4, 2.0


def published_config(vocab_size: int, pad_token_id: int) -> dict[str, Any]:
    """config.json as jina-embeddings-v3 publishes it, at a tiny size."""
    return {
        "architectures": ["XLMRobertaLoRA"],
        "auto_map": {
            "AutoConfig": f"{IMPLEMENTATION}--configuration_xlm_roberta.XLMRobertaFlashConfig",
            "AutoModel": f"{IMPLEMENTATION}--modeling_lora.XLMRobertaLoRA",
            "AutoModelForMaskedLM": f"{IMPLEMENTATION}--modeling_xlm_roberta.XLMRobertaForMaskedLM",
        },
        "model_type": "xlm-roberta",
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": INTERMEDIATE,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": 130,
        "type_vocab_size": 1,
        "layer_norm_eps": 1e-5,
        "pad_token_id": pad_token_id,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "position_embedding_type": "rotary",
        "rotary_emb_base": ROPE_THETA,
        "use_flash_attn": True,
        "emb_pooler": None,
        "load_trained_adapters": True,
        "lora_adaptations": list(TASKS),
        "lora_alpha": ALPHA,
        "lora_dropout_p": 0.0,
        "lora_main_params_trainable": False,
        "lora_rank": RANK,
        "task_instructions": INSTRUCTIONS,
        "matryoshka_dimensions": [8, 16, 32],
        "truncate_dim": None,
        "torch_dtype": "float32",
    }


def reference_model(vocab_size: int, pad_token_id: int, seed: int = 0) -> Any:
    """transformers' JinaEmbeddingsV3Model with the published RoPE base, random weights."""
    from transformers import JinaEmbeddingsV3Config, JinaEmbeddingsV3Model

    torch.manual_seed(seed)
    config = JinaEmbeddingsV3Config(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=INTERMEDIATE,
        max_position_embeddings=130,
        pad_token_id=pad_token_id,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
    )
    model = JinaEmbeddingsV3Model(config).eval()
    with torch.no_grad():  # layer norms away from their initial identity, so that they count
        for name, weight in model.named_parameters():
            if "LayerNorm" in name or "layernorm" in name:
                weight.add_(torch.randn_like(weight) * 0.2)
    return model


def lora_factors(
    model: Any, *, tasks: int = len(TASKS), rank: int = RANK, seed: int = 1, scale: float = 0.3
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Random non-zero LoRA factors (A, B) for `tasks` tasks of `rank` per adapted layer of the
    port `model` (sizes from its config), keyed by the published layer name."""
    generator = torch.Generator().manual_seed(seed)

    def pair(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(a, generator=generator) * scale, torch.randn(b, generator=generator) * scale

    config = model.config
    hidden, intermediate = config.hidden_size, config.intermediate_size
    rows = {"word_embeddings": config.vocab_size, "token_type_embeddings": config.type_vocab_size}
    factors = {f"embeddings.{name}": pair((tasks, count, rank), (tasks, rank, hidden)) for name, count in rows.items()}
    shapes = {"mixer.Wqkv": (hidden, 3 * hidden), "mixer.out_proj": (hidden, hidden)}
    shapes.update({"mlp.fc1": (hidden, intermediate), "mlp.fc2": (intermediate, hidden)})
    for i in range(config.num_hidden_layers):
        for name, (fan_in, fan_out) in shapes.items():
            factors[f"encoder.layers.{i}.{name}"] = pair((tasks, rank, fan_in), (tasks, fan_out, rank))
    factors["pooler.dense"] = pair((tasks, rank, hidden), (tasks, hidden, rank))
    return factors


def adapter_tensors(factors: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The factors under the published names: each layer's stacked A and B."""
    out = {}
    for layer, (a, b) in factors.items():
        prefix = f"roberta.{layer}.parametrizations.weight.0."
        out[f"{prefix}lora_A"], out[f"{prefix}lora_B"] = a, b
    return out


def delta(layer: str, factors: tuple[torch.Tensor, torch.Tensor], task: int) -> torch.Tensor:
    """The published formula: s * A @ B for an embedding table, s * B @ A for a linear weight."""
    a, b = factors
    scale = ALPHA / RANK
    return scale * (a[task] @ b[task] if layer.startswith("embeddings.") else b[task] @ a[task])


def _port_names(i: int) -> dict[str, str]:
    """Published layer name -> the port's parameter prefix, for layer `i` (Wqkv is three)."""
    return {
        f"encoder.layers.{i}.mixer.out_proj": f"layers.{i}.self_attn.o_proj",
        f"encoder.layers.{i}.mlp.fc1": f"layers.{i}.mlp.fc1",
        f"encoder.layers.{i}.mlp.fc2": f"layers.{i}.mlp.fc2",
        f"encoder.layers.{i}.norm1": f"layers.{i}.post_attention_layernorm",
        f"encoder.layers.{i}.norm2": f"layers.{i}.post_mlp_layernorm",
    }


def published_weights(model: Any, factors: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The port's state dict under the published names, with the LoRA factors beside each weight."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    names = {"embeddings.word_embeddings": "embeddings.word_embeddings", "pooler.dense": "pooler.dense"}
    names["embeddings.token_type_embeddings"] = "embeddings.token_type_embeddings"
    names["emb_ln"] = "embeddings.LayerNorm"
    base: dict[str, torch.Tensor] = {}
    for i in range(LAYERS):
        names.update(_port_names(i))
        attention = f"layers.{i}.self_attn."
        for part in ("weight", "bias"):
            base[f"encoder.layers.{i}.mixer.Wqkv.{part}"] = torch.cat(
                [state[f"{attention}{p}_proj.{part}"] for p in ("q", "k", "v")]
            )
    for published, port in names.items():
        for part in ("weight", "bias"):
            if f"{port}.{part}" in state:
                base[f"{published}.{part}"] = state[f"{port}.{part}"]
    out: dict[str, torch.Tensor] = {}
    for name, tensor in base.items():
        layer = name.rsplit(".", 1)[0]
        if name.endswith(".weight") and layer in factors:
            out[f"roberta.{layer}.parametrizations.weight.original"] = tensor
            out.update(adapter_tensors({layer: factors[layer]}))
        else:
            out[f"roberta.{name}"] = tensor
    return out


def merged_model(vocab_size: int, pad_token_id: int, task: int, seed: int = 0) -> Any:
    """The reference: the built port with `task`'s LoRA merged into its weights by the formula."""
    model = reference_model(vocab_size, pad_token_id, seed)
    factors = lora_factors(model)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for layer, pair in factors.items():
            change = delta(layer, pair, task)
            if layer.endswith("mixer.Wqkv"):
                i = layer.split(".")[2]
                for part, chunk in zip(("q", "k", "v"), change.chunk(3, dim=0), strict=True):
                    params[f"layers.{i}.self_attn.{part}_proj.weight"].add_(chunk)
                continue
            port = {**_port_names(int(layer.split(".")[2]))}.get(layer, layer) if "layers." in layer else layer
            params[f"{port}.weight"].add_(change)
    return model


def tiny_jina_v3(root: Path, *, seed: int = 0) -> Path:
    """The published layout in `root`; the reference is `merged_model(...)` on the same seed."""
    from safetensors.torch import save_file

    tokenizer = unigram_tokenizer()
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    pad = int(tokenizer.pad_token_id)
    model = reference_model(len(tokenizer), pad, seed)
    root.mkdir(parents=True, exist_ok=True)
    weights = published_weights(model, lora_factors(model))
    save_file(weights, root / "model.safetensors", metadata={"format": "pt"})
    (root / "config.json").write_text(json.dumps(published_config(len(tokenizer), pad), indent=2))
    tokenizer.save_pretrained(root)
    st_layout(root, pooling="mean", hidden=HIDDEN, normalize=True, max_seq_length=128, prompts=INSTRUCTIONS)
    modules = json.loads((root / "modules.json").read_text())
    modules[0]["type"] = "custom_st.Transformer"
    (root / "modules.json").write_text(json.dumps(modules))
    (root / "custom_st.py").write_text("from sentence_transformers.models import Transformer  # noqa\n")
    return root


def tiny_jina_v3_hf(root: Path, *, adapters: str = "none", seed: int = 0) -> Path:
    """A `-hf` conversion (`model_type: jina_embeddings_v3`, transformers' own layout) in `root`,
    its base weights those of `reference_model(...)` on the same seed. `adapters`: "folders" adds
    a PEFT adapter folder per task, "weights" the stacked LoRA factors beside the base weights."""
    from safetensors.torch import load_file, save_file

    tokenizer = unigram_tokenizer()
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    model = reference_model(len(tokenizer), int(tokenizer.pad_token_id), seed)
    model.save_pretrained(root)
    tokenizer.save_pretrained(root)
    st_layout(root, pooling="mean", hidden=HIDDEN, normalize=True, max_seq_length=128)
    if adapters == "folders":
        for task in TASKS:
            (root / task).mkdir()
            (root / task / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    elif adapters == "weights":
        weights = load_file(root / "model.safetensors")
        for layer, (a, b) in lora_factors(model).items():
            weights[f"{layer}.lora_A"], weights[f"{layer}.lora_B"] = a, b
        save_file(weights, root / "model.safetensors", metadata={"format": "pt"})
    return root
