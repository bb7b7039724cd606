"""Random decoder embedders in their published layouts, wider than the tiny ones.

Qwen3-Embedding (last token, left padding) and EmbeddingGemma (bidirectional gemma3_text, mean,
a Dense layer, prompts), as `tests/builders/llm_rerankers.py` and `catalogue.py` lay them out, with a
hidden size of 256: int8's dynamic quantization of a 32-wide random decoder turns single vectors
round (cosine 0.35 to float32 measured on one), which says nothing of the recipe; at 256 every
vector keeps a cosine of 0.99 or more. An export takes as long at either width.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tests.builders.catalogue import GEMMA_PROMPTS
from tests.builders.llm_rerankers import gemma_tokenizer, qwen_tokenizer
from tests.builders.text import st_layout

HIDDEN = 256
_SHAPE: dict[str, Any] = {"hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN, "num_hidden_layers": 2}
_HEADS: dict[str, Any] = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": HIDDEN // 2}


def wide_qwen3_embedding(root: Path, *, seed: int = 0) -> Path:
    """`Qwen3ForCausalLM` in config.json, the bare model's weights, last-token pooling, normalised."""
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(seed)
    tokenizer = qwen_tokenizer()
    config = Qwen3Config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **_SHAPE, **_HEADS)
    Qwen3Model(config).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    saved = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**saved, "architectures": ["Qwen3ForCausalLM"]}))
    st_layout(root, pooling="lasttoken", hidden=HIDDEN, normalize=True, max_seq_length=64)
    return root


def wide_embeddinggemma(root: Path, *, seed: int = 0) -> Path:
    """Bidirectional gemma3_text with a sliding window of 3 in its first layer, mean pooling, a
    Dense layer and the query/document prompts."""
    from transformers import Gemma3TextConfig, Gemma3TextModel

    torch.manual_seed(seed)
    tokenizer = gemma_tokenizer(padding_side="right")
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=128,
        sliding_window=3,
        layer_types=["sliding_attention", "full_attention"],
        use_bidirectional_attention=True,
        pad_token_id=tokenizer.pad_token_id,
        **_SHAPE,
        **_HEADS,
    )
    Gemma3TextModel(config).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    dense = (48, "torch.nn.modules.linear.Identity")
    st_layout(
        root, pooling="mean", hidden=HIDDEN, normalize=True, max_seq_length=64, dense=dense, prompts=GEMMA_PROMPTS
    )
    return root
