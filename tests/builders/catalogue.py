"""Tiny random embedders in the published layouts of catalogue records not built elsewhere:
ModernBERT embedders (gte-modernbert CLS, modernbert-embed mean + prefixes), nomic-embed-text-v1.5
(nomic_bert with `auto_map` into nomic's hub code) and EmbeddingGemma (bidirectional gemma3_text)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.builders.llm_rerankers import gemma_tokenizer
from tests.builders.text import st_layout, wordpiece_tokenizer

NOMIC_HUB_CODE = "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel"
NOMIC_PROMPTS = {"query": "search_query: ", "document": "search_document: "}
GEMMA_PROMPTS = {"query": "task: search result | query: ", "document": "title: none | text: "}


def tiny_modernbert_embedder(root: Path, *, pooling: str = "mean", seed: int = 0) -> Path:
    from transformers import ModernBertConfig, ModernBertModel

    torch.manual_seed(seed)
    tokenizer = wordpiece_tokenizer()
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    config = ModernBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
    )
    ModernBertModel(config).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    prompts = NOMIC_PROMPTS if pooling == "mean" else None
    st_layout(root, pooling=pooling, hidden=32, normalize=True, max_seq_length=64, prompts=prompts)
    return root


def tiny_gte_modernbert(root: Path) -> Path:
    return tiny_modernbert_embedder(root, pooling="cls")


def tiny_nomic(root: Path, *, seed: int = 0) -> Path:
    """nomic_bert as published: its config names nomic's hub code, which transformers' port replaces."""
    from transformers import NomicBertConfig, NomicBertModel

    torch.manual_seed(seed)
    tokenizer = wordpiece_tokenizer()
    config = NomicBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
    )
    NomicBertModel(config).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    saved = json.loads((root / "config.json").read_text())
    saved["auto_map"] = {"AutoModel": NOMIC_HUB_CODE}
    (root / "config.json").write_text(json.dumps(saved))
    st_layout(root, pooling="mean", hidden=32, normalize=True, max_seq_length=64, prompts=NOMIC_PROMPTS)
    return root


def tiny_embeddinggemma(root: Path, *, seed: int = 0) -> Path:
    from transformers import Gemma3TextConfig, Gemma3TextModel

    torch.manual_seed(seed)
    tokenizer = gemma_tokenizer(padding_side="right")
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=128,
        use_bidirectional_attention=True,
        pad_token_id=tokenizer.pad_token_id,
    )
    Gemma3TextModel(config).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    st_layout(
        root,
        pooling="mean",
        hidden=32,
        normalize=True,
        max_seq_length=64,
        dense=(48, "torch.nn.modules.linear.Identity"),
        prompts=GEMMA_PROMPTS,
    )
    return root
