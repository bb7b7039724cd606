"""Kinds beyond dense text, recognised from a directory's own files.

- BGE-M3 (FlagEmbedding layout): `colbert_linear.pt` and `sparse_linear.pt` beside the encoder.
- colbert-ai checkpoints: `artifact.metadata`; PyLate checkpoints: a sentence-transformers layout
  with a Dense projection, no Pooling, and ColBERT lengths or prefixes in its configuration.
- SPLADE in the sentence-transformers SparseEncoder layout (`MLMTransformer` / `SpladePooling`).
- `*ForSequenceClassification`: one label is a reranker, several a classifier.
- A causal LM whose chat template renders the `query` and `document` roles: an LLM reranker.

Code outside the libraries (`auto_map` in config.json, a modules.json module outside
sentence_transformers) runs only with `trust_remote_code: true` and, when HF_HUB_OFFLINE is
set, only from files already here (the model directory or the local hub cache). Where
transformers ships a native port of the family, the port serves it and the hub code is ignored.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from model_registry.errors import ModelUnavailable
from model_registry.llm_rerank import chat_template, has_pair_roles
from model_registry.types import Kind

_CAUSAL_LM = ("ForCausalLM", "LMHeadModel")
#: model_type -> transformers' native port of a family published with hub code.
NATIVE_PORTS = {
    "nomic_bert": "transformers.models.nomic_bert",
    "jina_embeddings_v3": "transformers.models.jina_embeddings_v3",
}
#: Libraries whose modules this server implements itself (PyLate's Dense in PyLate checkpoints).
_LIBRARY_MODULES = ("sentence_transformers.", "pylate.")
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


def remote_classes(config: dict[str, Any], module_types: Sequence[str]) -> list[str]:
    """The classes outside the libraries that these files name: config.json's `auto_map`
    (AutoModel's first) and modules.json modules outside sentence_transformers and PyLate."""
    auto_map = config.get("auto_map")
    named: list[str] = []
    if isinstance(auto_map, dict):
        ordered = sorted(auto_map.items(), key=lambda item: item[0] != "AutoModel")
        for _, value in ordered:
            named.extend(str(v) for v in (value if isinstance(value, list) else [value]) if v)
    named.extend(t for t in module_types if t and not t.startswith(_LIBRARY_MODULES))
    return list(dict.fromkeys(named))


def native_port(model_type: str) -> str | None:
    """transformers' own module for a family published with hub code, when installed."""
    module = NATIVE_PORTS.get(model_type)
    try:
        return module if module and importlib.util.find_spec(module) is not None else None
    except ImportError:
        return None


def check_remote_code(roots: Sequence[Path], classes: list[str], trusted: bool) -> None:
    """Refuse code outside the libraries unless trusted and, offline, present in `roots` (the
    model and its transformer directory) or the local hub cache."""
    if not classes:
        return
    shown, root = ", ".join(classes[:3]), roots[0]
    if not trusted:
        raise ModelUnavailable(
            f"{root} names code outside transformers and sentence-transformers ({shown}): without it the model "
            "would run as another architecture, with weights missing or unused. Set `trust_remote_code: true` on "
            "the model to run that code (from the model directory or the local hub cache)"
        )
    missing = [name for name in classes if all(_code_file(r, name) is None for r in roots)]
    if missing and _offline():
        raise ModelUnavailable(
            f"`trust_remote_code: true`, but the code of {', '.join(missing)} is neither in {root} nor in the "
            "local hub cache, and HF_HUB_OFFLINE is set: download the model and the repository its code lives "
            "in (infinity-server download) before serving offline"
        )


def _code_file(root: Path, reference: str) -> Path | None:
    """The .py file of 'module.Class' (in `root`) or 'org/repo--module.Class' (in the hub cache)."""
    from model_registry.sources import hub_cache_dir

    repo, _, local = reference.rpartition("--")
    module = local.rsplit(".", 1)[0].replace(".", "/") + ".py"
    if not repo:
        return root / module if (root / module).is_file() else None
    snapshots = hub_cache_dir() / ("models--" + repo.replace("/", "--")) / "snapshots"
    found = sorted(snapshots.glob(f"*/{module}")) if snapshots.is_dir() else []
    return found[0] if found else None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
