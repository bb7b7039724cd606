"""A tiny random nomic-embed-multimodal in the published layout: a PEFT LoRA adapter directory
(adapter_config.json naming its base `Qwen/Qwen2.5-VL-3B-Instruct`, adapter_model.safetensors with
the factors under the module names transformers 4.50 gave Qwen2.5-VL, `model.layers.N...`, as
colpali-engine trained and saved them) with the processor's files saying `BiQwen2_5_Processor`,
and a base directory apart: a tiny `Qwen2_5_VLForConditionalGeneration` and its processor, as
Qwen publishes Qwen2.5-VL-3B-Instruct.

The factors are written here, not by PEFT: PEFT saves against the modules of the transformers it
runs with (`model.language_model.layers.N...` in transformers 5), while the published adapter
names those of the release it was trained with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tests.builders.llm_rerankers import qwen_tokenizer

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
HIDDEN = 32
BASE_NAME = "Qwen/Qwen2.5-VL-3B-Instruct"
#: colpali-engine's training config's LoRA targets, as the published adapter_config.json holds them.
TARGET_MODULES = "(.*(model).*(down_proj|gate_proj|up_proj|k_proj|q_proj|v_proj|o_proj).*$|.*(custom_text_proj).*$)"
_ADAPTED = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
_ADAPTED_MLP = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
RANK, ALPHA = 4, 8


def tiny_nomic_multimodal(
    root: Path, *, seed: int = 0, processor_class: str = "BiQwen2_5_Processor"
) -> dict[str, Path]:
    """{"adapter": the published directory, "base": the base model's} under `root`."""
    base = tiny_qwen2_5_vl(root / "base", seed=seed)
    adapter = root / "adapter"
    adapter.mkdir(parents=True)
    _published_processor(adapter, processor_class)
    _save_factors(base, adapter, seed + 1)
    return {"adapter": adapter, "base": base}


def _published_processor(directory: Path, processor_class: str) -> None:
    """The processor's files as transformers 4 saved them for colpali-engine's processor class:
    the image processor's settings in preprocessor_config.json, the tokenizer's files, each
    naming `processor_class`."""
    _processor(max_pixels=768 * 28 * 28).save_pretrained(directory)
    combined = directory / "processor_config.json"
    images = json.loads(combined.read_text())["image_processor"]
    combined.unlink()
    (directory / "preprocessor_config.json").write_text(json.dumps(images | {"processor_class": processor_class}))
    tokenizer_config = directory / "tokenizer_config.json"
    settings = json.loads(tokenizer_config.read_text()) | {"processor_class": processor_class}
    tokenizer_config.write_text(json.dumps(settings, indent=2))


def _processor(*, max_pixels: int) -> Any:
    from transformers import Qwen2VLImageProcessor, Qwen2VLVideoProcessor
    from transformers.models.qwen2_5_vl import Qwen2_5_VLProcessor

    tokenizer: Any = qwen_tokenizer(padding_side="right")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", *VISION_TOKENS]})
    images = Qwen2VLImageProcessor(
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
        min_pixels=56 * 56,
        max_pixels=max_pixels,
        image_mean=[0.48145466, 0.4578275, 0.40821073],
        image_std=[0.26862954, 0.26130258, 0.27577711],
    )
    videos = Qwen2VLVideoProcessor(patch_size=14, merge_size=2, temporal_patch_size=2)
    return Qwen2_5_VLProcessor(image_processor=images, tokenizer=tokenizer, video_processor=videos)


def tiny_qwen2_5_vl(root: Path, *, seed: int = 0) -> Path:
    """Qwen2.5-VL's config and weights (`Qwen2_5_VLForConditionalGeneration`) and its processor."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    processor = _processor(max_pixels=12845056)
    tokenizer = processor.tokenizer
    tokens = {
        "image_token_id": "<|image_pad|>",
        "video_token_id": "<|video_pad|>",
        "vision_start_token_id": "<|vision_start|>",
        "vision_end_token_id": "<|vision_end|>",
    }
    ids = {key: tokenizer.convert_tokens_to_ids(token) for key, token in tokens.items()}
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": HIDDEN,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 4096,
        "rope_parameters": rope,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "initializer_range": 0.2,
    }
    vision: dict[str, Any] = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": HIDDEN,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 56,
        "fullatt_block_indexes": [1],
        "initializer_range": 0.2,
    }
    torch.manual_seed(seed)
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids)
    Qwen2_5_VLForConditionalGeneration(config).eval().save_pretrained(root)
    processor.save_pretrained(root)
    return root


def _save_factors(base: Path, adapter: Path, seed: int) -> None:
    """LoRA factors of every attention and MLP projection of the language model, under the names
    colpali-engine saved them, and the adapter_config.json it wrote."""
    from safetensors.torch import save_file

    config = json.loads((base / "config.json").read_text())
    text = config["text_config"]
    hidden, inner = int(text["hidden_size"]), int(text["intermediate_size"])
    heads, kv_heads = int(text["num_attention_heads"]), int(text["num_key_value_heads"])
    head_dim = hidden // heads
    shapes = {
        "self_attn.q_proj": (hidden, hidden),
        "self_attn.k_proj": (kv_heads * head_dim, hidden),
        "self_attn.v_proj": (kv_heads * head_dim, hidden),
        "self_attn.o_proj": (hidden, hidden),
        "mlp.gate_proj": (inner, hidden),
        "mlp.up_proj": (inner, hidden),
        "mlp.down_proj": (hidden, inner),
    }
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(int(text["num_hidden_layers"])):
        for module in (*_ADAPTED, *_ADAPTED_MLP):
            out, into = shapes[module]
            key = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(RANK, into, generator=generator) * 0.3
            tensors[f"{key}.lora_B.weight"] = torch.randn(out, RANK, generator=generator) * 0.3
    save_file(tensors, str(adapter / "adapter_model.safetensors"), metadata={"format": "pt"})
    settings: dict[str, Any] = {
        "alpha_pattern": {},
        "auto_mapping": None,
        "base_model_name_or_path": BASE_NAME,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": "gaussian",
        "layers_pattern": None,
        "layers_to_transform": None,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.1,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": RANK,
        "rank_pattern": {},
        "revision": None,
        "target_modules": TARGET_MODULES,
        "task_type": "FEATURE_EXTRACTION",
        "use_dora": False,
        "use_rslora": False,
    }
    (adapter / "adapter_config.json").write_text(json.dumps(settings, indent=2))
