"""A tiny random GME in the published layout (Alibaba-NLP/gme-Qwen2-VL-2B-Instruct's): a
`Qwen2VLForConditionalGeneration` config and weights, a Qwen-style tokenizer holding the vision
tokens, the Qwen2-VL processor (14 px patches merged 2 x 2, as published) and, beside them, the
model's own `gme_inference.py` (here a stand-in: the server reads its presence, never its code)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.builders.llm_rerankers import qwen_tokenizer

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
HIDDEN = 32
#: What the published directory holds beside the weights; its presence marks GME.
REFERENCE_CODE = '"""Stand-in for the GME reference code published beside the weights."""\n'


def tiny_gme(root: Path, *, seed: int = 0, reference_code: bool = True) -> Path:
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    tokenizer: Any = qwen_tokenizer(padding_side="right")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", *VISION_TOKENS]})
    images = Qwen2VLImageProcessor(
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
        min_pixels=56 * 56,
        max_pixels=28 * 28 * 1280,
        image_mean=[0.48145466, 0.4578275, 0.40821073],
        image_std=[0.26862954, 0.26130258, 0.27577711],
    )
    videos = Qwen2VLVideoProcessor(patch_size=14, merge_size=2, temporal_patch_size=2)
    processor = Qwen2VLProcessor(image_processor=images, tokenizer=tokenizer, video_processor=videos)
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
        "embed_dim": 32,
        "hidden_size": HIDDEN,
        "num_heads": 2,
        "mlp_ratio": 2,
        "patch_size": 14,
    }
    vision |= {"spatial_merge_size": 2, "temporal_patch_size": 2, "initializer_range": 0.2}
    torch.manual_seed(seed)
    config = Qwen2VLConfig(text_config=text, vision_config=vision, **ids)
    Qwen2VLForConditionalGeneration(config).eval().save_pretrained(root)
    processor.save_pretrained(root)
    if reference_code:
        (root / "gme_inference.py").write_text(REFERENCE_CODE)
    return root
