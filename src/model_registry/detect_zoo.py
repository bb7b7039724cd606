"""Kinds beyond dense text, recognised from a directory's own files.

- BGE-M3 (FlagEmbedding layout): `colbert_linear.pt` and `sparse_linear.pt` beside the encoder.
- colbert-ai checkpoints: `artifact.metadata`; PyLate checkpoints: a sentence-transformers layout
  with a Dense projection, no Pooling, and ColBERT lengths or prefixes in its configuration.
- SPLADE in the sentence-transformers SparseEncoder layout (`MLMTransformer` / `SpladePooling`).
- `*ForSequenceClassification`: one label is a reranker, several a classifier.
- A causal LM whose chat template renders the `query` and `document` roles: an LLM reranker.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from model_registry.llm_rerank import chat_template, has_pair_roles
from model_registry.types import Kind

_CAUSAL_LM = ("ForCausalLM", "LMHeadModel")
_PYLATE_KEYS = ("query_prefix", "document_prefix", "query_length", "document_length", "do_query_expansion")


def label_count(config: dict[str, Any]) -> int:
    """Labels of a classification head: `id2label` when present, else `num_labels` (2 by default)."""
    labels = config.get("id2label")
    if isinstance(labels, dict) and labels:
        return len(labels)
    return int(config.get("num_labels", 2))


def is_pylate(root: Path, modules: Sequence[str]) -> bool:
    if "Dense" not in modules or "Pooling" in modules:
        return False
    path = root / "config_sentence_transformers.json"
    try:
        extra = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except ValueError:
        return False
    return isinstance(extra, dict) and any(key in extra for key in _PYLATE_KEYS)


def is_causal_lm(architectures: Sequence[str]) -> bool:
    """A generative LM: its head predicts the next token (a reranker's yes/no, never a vector)."""
    return any(a.endswith(_CAUSAL_LM) for a in architectures)


def _reranker_chat_template(root: Path) -> bool:
    path = root / "tokenizer_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        return has_pair_roles(chat_template(root, config if isinstance(config, dict) else {}))
    except (OSError, ValueError):
        return False


def zoo_kind(root: Path, config: dict[str, Any], modules: Sequence[str]) -> Kind | None:
    """The kind these files say, or None to fall back to the dense rules."""
    if (root / "colbert_linear.pt").is_file() and (root / "sparse_linear.pt").is_file():
        return Kind.MULTI_OUTPUT
    if (root / "artifact.metadata").is_file() or is_pylate(root, modules):
        return Kind.MULTIVECTOR
    if "SpladePooling" in modules or "MLMTransformer" in modules:
        return Kind.SPARSE
    architectures = [str(a) for a in config.get("architectures") or ()]
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        return Kind.RERANKER if label_count(config) == 1 else Kind.CLASSIFIER
    if is_causal_lm(architectures) and _reranker_chat_template(root):
        return Kind.RERANKER
    return None
