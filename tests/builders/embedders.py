"""Tiny random embedders of the families the torch engine packs: XLM-R, ModernBERT (with a local
attention window), a Qwen3 decoder with last-token pooling and left padding, and Gemma3 with
bidirectional attention (EmbeddingGemma's layout), each in the sentence-transformers layout."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.builders.text import bpe_tokenizer, st_layout
from tests.builders.xlmr import unigram_tokenizer
from tests.builders.zoo import SMALL, modernbert_tokenizer


def tiny_xlmr(root: Path, *, seed: int = 0) -> Path:
    """An XLM-R encoder, mean-pooled: positions start after the pad token id."""
    from transformers import XLMRobertaConfig, XLMRobertaModel

    torch.manual_seed(seed)
    tokenizer = unigram_tokenizer()
    config = XLMRobertaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=130, pad_token_id=tokenizer.pad_token_id, **SMALL
    )
    XLMRobertaModel(config, add_pooling_layer=False).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    st_layout(root, pooling="mean", hidden=32, normalize=True, max_seq_length=64)
    return root


def tiny_modernbert(root: Path, *, seed: int = 0) -> Path:
    """A ModernBERT encoder, CLS-pooled, whose first layer sees 2 tokens either side."""
    from transformers import ModernBertConfig, ModernBertModel

    torch.manual_seed(seed)
    tokenizer = modernbert_tokenizer()
    config = ModernBertConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=128,
        local_attention=4,
        layer_types=["sliding_attention", "full_attention"],
        pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        **SMALL,
    )
    ModernBertModel(config).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    st_layout(root, pooling="cls", hidden=32, normalize=True, max_seq_length=64)
    return root


def tiny_qwen3(root: Path, *, seed: int = 0) -> Path:
    """A Qwen3 decoder embedder (grouped-query attention), last-token pooled, left padded."""
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(seed)
    tokenizer = bpe_tokenizer(padding_side="left")
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        **SMALL,
    )
    Qwen3Model(config).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    st_layout(root, pooling="lasttoken", hidden=32, normalize=True, max_seq_length=64)
    return root


def tiny_gemma3(root: Path, *, seed: int = 0) -> Path:
    """A bidirectional Gemma3 encoder, mean-pooled, whose first layer sees 2 tokens either side."""
    from transformers import Gemma3TextConfig, Gemma3TextModel

    torch.manual_seed(seed)
    tokenizer = bpe_tokenizer(padding_side="right")
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=128,
        sliding_window=3,
        layer_types=["sliding_attention", "full_attention"],
        use_bidirectional_attention=True,
        pad_token_id=tokenizer.pad_token_id,
        **SMALL,
    )
    Gemma3TextModel(config).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    st_layout(root, pooling="mean", hidden=32, normalize=True, max_seq_length=64)
    return root
