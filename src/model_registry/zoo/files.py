"""The facts about a directory's files that the detection rules (`detection.rules`, the families' own) read.

- label counts of classification heads, PyLate's layout, causal LMs, chat templates that
  render the `query` and `document` roles (an LLM reranker's);
- code outside the libraries: `auto_map` in config.json, a modules.json module outside
  sentence_transformers and PyLate. It runs only with `trust_remote_code: true` and, when
  HF_HUB_OFFLINE is set, only from files already here (the model directory or the local hub
  cache).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from model_registry.errors import ModelUnavailable
from model_registry.zoo.rerank_templates import chat_template, has_pair_roles

_CAUSAL_LM = ("ForCausalLM", "LMHeadModel")
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


def reranker_chat_template(root: Path) -> bool:
    """Whether the tokenizer's chat template renders the `query` and `document` roles."""
    path = root / "tokenizer_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        return has_pair_roles(chat_template(root, config if isinstance(config, dict) else {}))
    except (OSError, ValueError):
        return False


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


def check_remote_code(roots: Sequence[Path], classes: list[str], trusted: bool) -> None:
    """Refuse code outside the libraries unless trusted and, offline, present in `roots` (the
    model and its transformer directory) or the local hub cache."""
    message = untrusted_code(roots[0], classes) if not trusted else offline_code(roots, classes)
    if message:
        raise ModelUnavailable(message)


def untrusted_code(root: Path, classes: Sequence[str]) -> str | None:
    """The refusal of code outside the libraries run without `trust_remote_code`."""
    if not classes:
        return None
    return (
        f"{root} names code outside transformers and sentence-transformers ({', '.join(classes[:3])}): without it "
        "the model would run as another architecture, with weights missing or unused. Set `trust_remote_code: true` "
        "on the model to run that code (from the model directory or the local hub cache)"
    )


def offline_code(roots: Sequence[Path], classes: Sequence[str]) -> str | None:
    """The refusal of trusted code that HF_HUB_OFFLINE keeps from being fetched and that is not here."""
    missing = [name for name in classes if all(_code_file(r, name) is None for r in roots)]
    if not missing or not _offline():
        return None
    return (
        f"`trust_remote_code: true`, but the code of {', '.join(missing)} is neither in {roots[0]} nor in the "
        "local hub cache, and HF_HUB_OFFLINE is set: download the model and the repository its code lives "
        "in (infinity-server download) before serving offline"
    )


def _code_file(root: Path, reference: str) -> Path | None:
    """The .py file of 'module.Class' (in `root`) or 'org/repo--module.Class' (in the hub cache)."""
    from model_registry.zoo.sources import hub_cache_dir

    repo, _, local = reference.rpartition("--")
    module = local.rsplit(".", 1)[0].replace(".", "/") + ".py"
    if not repo:
        return root / module if (root / module).is_file() else None
    snapshots = hub_cache_dir() / ("models--" + repo.replace("/", "--")) / "snapshots"
    found = sorted(snapshots.glob(f"*/{module}")) if snapshots.is_dir() else []
    return found[0] if found else None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
