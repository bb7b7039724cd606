"""A tiny random Qwen3-VL-Embedding in the published layout: `Qwen3VLForConditionalGeneration`'s
config and weights, a Qwen-style tokenizer with the vision tokens and a ChatML chat template that
draws an image as `<|vision_start|><|image_pad|><|vision_end|>`, the Qwen3-VL processor (16 px
patches merged 2 x 2, as published) and sentence-transformers' modules: Transformer (with the
published `processing_kwargs`), Pooling (lasttoken) and Normalize."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tests.builders.llm_rerankers import qwen_tokenizer
from tests.builders.text import st_layout

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}"
    "{%- else %}{%- for part in message.content %}"
    "{%- if part.type == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part.type == 'text' %}{{- part.text }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
HIDDEN = 32


def tiny_qwen3_vl_embedding(root: Path, *, seed: int = 0, prompts: dict[str, str] | None = None) -> Path:
    tiny_qwen3_vl(root, seed=seed)
    st_layout(root, pooling="lasttoken", hidden=HIDDEN, normalize=True, max_seq_length=512, prompts=prompts)
    settings_path = root / "sentence_bert_config.json"
    settings = json.loads(settings_path.read_text())
    settings |= {
        "transformer_task": "feature-extraction",
        "message_format": "structured",
        "processing_kwargs": {"chat_template": {"add_generation_prompt": True}},
    }
    settings_path.write_text(json.dumps(settings))
    return root


def tiny_qwen3_vl_reranker(root: Path, *, seed: int = 0) -> Path:
    """Qwen3-VL-Reranker as published: the Qwen3-VL files alone (no sentence-transformers modules),
    whose tokenizer holds 'yes' and 'no' as single tokens."""
    tiny_qwen3_vl(root, seed=seed)
    return root


def tiny_qwen3_vl(root: Path, *, seed: int = 0) -> Path:
    """`Qwen3VLForConditionalGeneration`'s config and weights (the LM head untied from the
    embeddings, so that the head's rows are read, not the embeddings'), the tokenizer and the
    processor."""
    from transformers import (
        Qwen2VLImageProcessor,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLProcessor,
        Qwen3VLVideoProcessor,
    )

    tokenizer: Any = qwen_tokenizer(padding_side="right")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", *VISION_TOKENS]})
    images = Qwen2VLImageProcessor(
        patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    videos = Qwen3VLVideoProcessor(patch_size=16, merge_size=2, temporal_patch_size=2)
    processor = Qwen3VLProcessor(
        image_processor=images, tokenizer=tokenizer, video_processor=videos, chat_template=CHAT_TEMPLATE
    )
    tokens = {
        "image_token_id": "<|image_pad|>",
        "video_token_id": "<|video_pad|>",
        "vision_start_token_id": "<|vision_start|>",
        "vision_end_token_id": "<|vision_end|>",
    }
    ids = {key: tokenizer.convert_tokens_to_ids(token) for key, token in tokens.items()}
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0, "mrope_interleaved": True}
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": HIDDEN,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "max_position_embeddings": 512,
        "rope_parameters": rope,
        "pad_token_id": tokenizer.pad_token_id,
        "initializer_range": 0.2,
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "depth": 2,
        "num_heads": 2,
        "out_hidden_size": HIDDEN,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 64,
        "deepstack_visual_indexes": [0],
        "initializer_range": 0.2,
    }
    torch.manual_seed(seed)
    config = Qwen3VLConfig(text_config=text, vision_config=vision, **ids)
    Qwen3VLForConditionalGeneration(config).eval().save_pretrained(root)
    processor.save_pretrained(root)
    return root
