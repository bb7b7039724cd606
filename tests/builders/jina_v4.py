"""A tiny random jina-embeddings-v4 in the published layout (jinaai/jina-embeddings-v4's):

- config.json: Qwen2.5-VL's (model_type `qwen2_5_vl`) naming `JinaEmbeddingsV4Model`, with the
  published `auto_map` and the keys its code reads (`task_names`, `matryoshka_dims`,
  `truncate_dim`, `single_vector_pool_strategy`, `multi_vector_projector_dim`, ...);
- the weights of `Qwen2_5_VLForConditionalGeneration` and, beside them, `multi_vector_projector`
  (a linear layer to `multi_vector_projector_dim`, with its bias);
- `adapters/`: one PEFT LoRA adapter holding every task's factors, keyed
  `base_model.model.<module>.lora_A.<task>.weight` (the published `MultiAdapterLinear` layout),
  on the language model's linear layers and the projector, the vision tower excluded;
- a Qwen-style tokenizer with the vision tokens, the Qwen2.5-VL processor (14 px patches merged
  2 x 2) and stand-ins for the model's own code (never run: the server reads its presence only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tests.builders.llm_rerankers import qwen_tokenizer

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
HIDDEN = 32
PROJECTED = 16
TASKS = ("retrieval", "text-matching", "code")
RANK, ALPHA = 4, 8
#: The language model's linear layers and the projector, as the published adapter targets them.
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "multi_vector_projector"]
CODE_FILES = ("modeling_jina_embeddings_v4.py", "configuration_jina_embeddings_v4.py", "custom_lora_module.py")
AUTO_MAP = {
    "AutoConfig": "configuration_jina_embeddings_v4.JinaEmbeddingsV4Config",
    "AutoModel": "modeling_jina_embeddings_v4.JinaEmbeddingsV4Model",
}


def published_class() -> Any:
    """`Qwen2_5_VLForConditionalGeneration` with the published `multi_vector_projector` beside it:
    the module layout the published weights and adapter names refer to."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    class Published(Qwen2_5_VLForConditionalGeneration):
        def __init__(self, config: Any) -> None:
            super().__init__(config)
            width = config.text_config.hidden_size
            self.multi_vector_projector = torch.nn.Linear(width, config.multi_vector_projector_dim)
            self.post_init()

    return Published


def tiny_jina_v4(root: Path, *, seed: int = 0, adapters: bool = True) -> Path:
    from transformers import Qwen2_5_VLConfig

    processor = _processor()
    tokenizer = processor.tokenizer
    tokens = {
        "image_token_id": "<|image_pad|>",
        "video_token_id": "<|video_pad|>",
        "vision_start_token_id": "<|vision_start|>",
        "vision_end_token_id": "<|vision_end|>",
    }
    ids = {key: tokenizer.convert_tokens_to_ids(token) for key, token in tokens.items()}
    torch.manual_seed(seed)
    config = Qwen2_5_VLConfig(text_config=_text(tokenizer), vision_config=_vision(), **ids)
    config.multi_vector_projector_dim = PROJECTED
    model = published_class()(config).eval()
    with torch.no_grad():  # wide enough that the tasks' vectors differ visibly
        model.multi_vector_projector.weight.normal_(0, 0.3)
    model.save_pretrained(root)
    processor.save_pretrained(root)
    _publish_config(root)
    for name in CODE_FILES:
        (root / name).write_text('"""Stand-in for the code published beside the weights; never run."""\n')
    if adapters:
        write_adapters(root / "adapters", model, seed=seed)
    return root


def _processor() -> Any:
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    tokenizer: Any = qwen_tokenizer(padding_side="right", max_length=4096)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", *VISION_TOKENS]})
    images = Qwen2VLImageProcessor(
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
        min_pixels=56 * 56,
        max_pixels=28 * 28 * 64,
        image_mean=[0.48145466, 0.4578275, 0.40821073],
        image_std=[0.26862954, 0.26130258, 0.27577711],
    )
    videos = Qwen2VLVideoProcessor(patch_size=14, merge_size=2, temporal_patch_size=2)
    return Qwen2_5_VLProcessor(image_processor=images, tokenizer=tokenizer, video_processor=videos)


def _text(tokenizer: Any) -> dict[str, Any]:
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": HIDDEN,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "initializer_range": 0.2,
        "tie_word_embeddings": True,
    }


def _vision() -> dict[str, Any]:
    return {
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


def _publish_config(root: Path) -> None:
    """config.json as published: the published class and code named, and the keys its code reads."""
    path = root / "config.json"
    config = json.loads(path.read_text())
    config |= {
        "architectures": ["JinaEmbeddingsV4Model"],
        "auto_map": AUTO_MAP,
        "task_names": list(TASKS),
        "matryoshka_dims": [8, 16, HIDDEN],
        "truncate_dim": None,
        "single_vector_pool_strategy": "mean",
        "multi_vector_projector_dim": PROJECTED,
        "pretrained_peft_model_name_or_path": None,
        "verbosity": 0,
    }
    path.write_text(json.dumps(config, indent=2))


def adapted_modules(model: Any) -> list[str]:
    """The module names the adapter adapts: the language model's targeted linear layers and the
    projector; the vision tower excluded."""
    names = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in TARGETS and ".visual." not in f".{name}":
            names.append(name)
    return names


def write_adapters(directory: Path, model: Any, *, seed: int = 0) -> Path:
    """The published adapter: every task's LoRA factors in one PEFT adapter, keyed by task."""
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed + 1)
    tensors = {}
    for name in adapted_modules(model):
        layer = model.get_submodule(name)
        for task in TASKS:
            a = torch.randn(RANK, layer.in_features, generator=generator) * 0.3
            b = torch.randn(layer.out_features, RANK, generator=generator) * 0.3
            tensors[f"base_model.model.{name}.lora_A.{task}.weight"] = a.contiguous()
            tensors[f"base_model.model.{name}.lora_B.{task}.weight"] = b.contiguous()
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    (directory / "adapter_config.json").write_text(json.dumps(adapter_config(), indent=2))
    return directory


def adapter_config() -> dict[str, Any]:
    return {
        "peft_type": "LORA",
        "task_type": "FEATURE_EXTRACTION",
        "base_model_name_or_path": "jinaai/jina-embeddings-v4",
        "r": RANK,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "target_modules": TARGETS,
        "exclude_modules": ".*visual.*",
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "init_lora_weights": True,
        "inference_mode": True,
    }
