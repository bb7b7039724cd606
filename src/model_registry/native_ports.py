"""transformers' native ports of families published with hub code of their own.

nomic-embed-text (`nomic_bert`) and jina-embeddings-v3's `-hf` conversions (`jina_embeddings_v3`)
load as they are: transformers reads their config and renames their weights at load. The
published gte-multilingual (`model_type: "new"`, Alibaba-NLP/new-impl's code) keeps weights that
transformers' `gte` port renames the same way, but a config it cannot read: the port reads it
through a view of the directory whose `config.json` says the same in `gte`'s terms (every other
file links to the original), kept in the engine cache (`$INFINITY_ENGINE_CACHE` or the user's
cache directory, under `ports/`).

new-impl's RoPE scaling (`rope_scaling: {type: ntk, factor: f}`) is a fixed NTK scaling: the base
times f, every frequency divided by f^(2/head_dim). In transformers' terms that is `linear`
scaling by f^(2/head_dim) over `rope_theta` times f.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from model_registry.backends.cache import cache_root
from model_registry.errors import ModelUnavailable

#: model_type -> transformers' native port of a family published with hub code.
NATIVE_PORTS = {
    "nomic_bert": "transformers.models.nomic_bert",
    "jina_embeddings_v3": "transformers.models.jina_embeddings_v3",
    "new": "transformers.models.gte",
}
#: The architectures a port serves where it does not serve all of its model_type's: gte's port
#: is checked here as an embedder only (new-impl's rerankers and masked LMs keep their own code).
_SERVED = {"new": ("NewModel", "NewForTokenClassification")}
#: new-impl's settings transformers' gte port implements, with the one value it implements.
_GTE_FIXED = {
    "position_embedding_type": "rope",
    "layer_norm_type": "layer_norm",
    "pack_qkv": True,
    "logn_attention_scale": False,
    "logn_attention_clip1": False,
}
#: new-impl's keys that mean nothing to the port once translated (attention kernels, unpadding).
_GTE_DROPPED = ("auto_map", "rope_scaling", "rope_theta", "unpad_inputs", "use_memory_efficient_attention")
_VIEWS = "ports"


def native_port(model_type: str, architectures: Sequence[str] = ()) -> str | None:
    """transformers' own module for a family published with hub code, when installed."""
    module = NATIVE_PORTS.get(model_type)
    served = _SERVED.get(model_type)
    if module is None or (served is not None and not any(a in served for a in architectures)):
        return None
    try:
        return module if importlib.util.find_spec(module) is not None else None
    except ImportError:
        return None


def port_name(model_type: str) -> str:
    """The port's own name (`gte` for new-impl's `new`)."""
    return NATIVE_PORTS.get(model_type, model_type).rsplit(".", 1)[-1]


def gte_config(config: dict[str, Any]) -> dict[str, Any]:
    """new-impl's config.json in the terms of transformers' gte port; what the port does not
    implement is refused, naming the setting."""
    for key, value in _GTE_FIXED.items():
        if config.get(key, value) != value:
            raise ModelUnavailable(
                f"gte-multilingual layout (model_type 'new') with {key}: {config[key]!r}: transformers' gte port, "
                f"which serves this family without its hub code, implements {key}: {value!r} only"
            )
    kept = {k: v for k, v in config.items() if k not in (*_GTE_DROPPED, *_GTE_FIXED)}
    kept.update(model_type="gte", architectures=["GteModel"], rope_parameters=_gte_rope(config))
    return kept


def _gte_rope(config: dict[str, Any]) -> dict[str, Any]:
    theta = float(config.get("rope_theta", 10000.0))
    scaling = config.get("rope_scaling")
    if not scaling:
        return {"rope_type": "default", "rope_theta": theta}
    if not isinstance(scaling, dict) or scaling.get("type") != "ntk" or scaling.get("mixed_b") is not None:
        raise ModelUnavailable(
            f"gte-multilingual layout (model_type 'new') with rope_scaling: {scaling!r}: transformers' gte port "
            "serves fixed NTK scaling ({type: ntk, factor: f}) or none"
        )
    factor = float(scaling["factor"])
    head_dim = int(config["hidden_size"]) // int(config["num_attention_heads"])
    return {"rope_type": "linear", "rope_theta": theta * factor, "factor": factor ** (2 / head_dim)}


def port_directory(directory: Path, config: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """The directory and config the native port reads: `directory` itself, or a view of it
    with a translated config.json for a layout whose config transformers cannot read."""
    if config.get("model_type") != "new":
        return directory, config
    translated = gte_config(config)
    text = json.dumps(translated, indent=2, sort_keys=True)
    key = hashlib.sha256(f"{directory.resolve()}\n{text}".encode()).hexdigest()[:20]
    view = cache_root(None) / _VIEWS / key
    if not (view / "config.json").is_file():
        _write_view(directory, view, text)
    return view, translated


def _write_view(directory: Path, view: Path, config_text: str) -> None:
    """Links to every entry of `directory` but config.json, written whole then renamed into place."""
    view.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=view.parent, prefix=".staging-"))
    try:
        for entry in directory.iterdir():
            if entry.name != "config.json":
                (staging / entry.name).symlink_to(entry.resolve())
        (staging / "config.json").write_text(config_text, encoding="utf-8")
        os.replace(staging, view)
    except OSError as error:
        if not (view / "config.json").is_file():  # another load wrote the same view first: use it
            raise ModelUnavailable(f"cannot lay out transformers' view of {directory} in {view}: {error}") from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)
