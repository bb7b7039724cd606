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

jina-embeddings-v3 as published (`model_type: "xlm-roberta"`, `XLMRobertaLoRA` in
jinaai/xlm-roberta-flash-implementation's code) keeps each adapted layer's weight as a torch
parametrization: `<layer>.parametrizations.weight.original` beside the task adapters' stacked
`<layer>.parametrizations.weight.0.lora_A` and `lora_B`. Its view holds the config in
`jina_embeddings_v3`'s terms and, written at the first load, the base weights under the names
that port renames at load and the LoRA factors apart in `lora.safetensors`
(`backends/torch/lora.py` applies them per task). The view leaves out the checkpoint's own ONNX
graphs, which select tasks by their own convention; ONNX Runtime runs an export of the view.
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

from model_registry.backends.base import LORA_FILE
from model_registry.backends.cache import cache_root
from model_registry.errors import ModelUnavailable

#: model_type -> transformers' native port of a family published with hub code.
NATIVE_PORTS = {
    "nomic_bert": "transformers.models.nomic_bert",
    "jina_embeddings_v3": "transformers.models.jina_embeddings_v3",
    "new": "transformers.models.gte",
}
#: The architectures a port serves where it does not serve all of its model_type's: gte's port
#: is checked here as an embedder and as the masked LM of SPLADE models (opensearch's doc-v3-gte);
#: new-impl's rerankers keep their own code.
_SERVED = {"new": ("NewModel", "NewForTokenClassification", "NewForMaskedLM")}
#: new-impl's architectures -> the gte port's classes.
_GTE_CLASSES = {"NewForMaskedLM": "GteForMaskedLM"}
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
#: The published jina-embeddings-v3's model class, and the one setting of its code the port implements.
_JINA_CLASS = "XLMRobertaLoRA"
_JINA_FIXED = {"position_embedding_type": "rotary"}
_JINA_DROPPED = ("auto_map", "rotary_emb_base", "use_flash_attn", "position_embedding_type")
_PARAMETRIZED = ".parametrizations.weight."
#: Files of the view written from the checkpoint's weights: the base, and the task adapters.
_WEIGHTS = "model.safetensors"
_INDEX = "model.safetensors.index.json"
#: The view's link to the checkpoint's directory, whose weights `jina_weights` splits.
_SOURCE = ".source"


def is_jina_lora(config: dict[str, Any]) -> bool:
    """jina-embeddings-v3's published layout: XLM-R with LoRA task adapters in its own code."""
    architectures = config.get("architectures") or ()
    return _JINA_CLASS in architectures and bool(config.get("lora_adaptations"))


def unapplied_adapters(root: Path) -> list[str]:
    """Task adapters in a `-hf` conversion's directory that transformers' jina_embeddings_v3 port
    would not apply: PEFT adapter folders, and LoRA factors among the weights (read from the
    safetensors headers only)."""
    found = sorted(str(p.parent.relative_to(root)) for p in root.glob("*/adapter_config.json"))
    for weights in sorted(root.glob("*.safetensors")):
        try:
            from safetensors import safe_open

            with safe_open(str(weights), framework="numpy") as handle:
                names: list[str] = handle.keys()
            lora = [name for name in names if "lora_" in name.lower()]
        except (OSError, ValueError, ImportError):
            continue
        if lora:
            found.append(f"{weights.name}: {len(lora)} LoRA weight(s) ({lora[0]}, ...)")
    return found


def jina_port() -> str | None:
    """transformers' jina_embeddings_v3 port, which serves the published layout, when installed."""
    return native_port("jina_embeddings_v3")


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
    architectures = [_GTE_CLASSES.get(str(a), "GteModel") for a in config.get("architectures") or ()]
    if "GteForMaskedLM" in architectures and config.get("hidden_act", "gelu") != "gelu":
        # the port's masked-LM head applies gelu whatever the config says; new-impl's, hidden_act
        raise ModelUnavailable(
            f"gte layout (model_type 'new') NewForMaskedLM with hidden_act: {config['hidden_act']!r}: transformers' "
            "gte port's masked-LM head implements gelu only"
        )
    kept = {k: v for k, v in config.items() if k not in (*_GTE_DROPPED, *_GTE_FIXED)}
    kept.update(model_type="gte", architectures=architectures or ["GteModel"], rope_parameters=_gte_rope(config))
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
    jina = is_jina_lora(config)
    if config.get("model_type") != "new" and not jina:
        return directory, config
    translated = jina_config(config) if jina else gte_config(config)
    text = json.dumps(translated, indent=2, sort_keys=True)
    weights = sorted(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in _weight_files(directory))
    # "split:2" names this view's layout (ONNX graphs left out) apart from views laid out otherwise.
    identity = "\n".join([str(directory.resolve()), text, *(["split:2", *weights] if jina else ())])
    view = cache_root(None) / _VIEWS / hashlib.sha256(identity.encode()).hexdigest()[:20]
    if not (view / "config.json").is_file():
        _write_view(directory, view, text, jina)
    return view, translated


def jina_config(config: dict[str, Any]) -> dict[str, Any]:
    """The published jina-embeddings-v3 config.json in the terms of transformers' port."""
    for key, value in _JINA_FIXED.items():
        if config.get(key, value) != value:
            raise ModelUnavailable(
                f"jina-embeddings-v3 layout ({_JINA_CLASS}) with {key}: {config[key]!r}: transformers' "
                f"jina_embeddings_v3 port, which serves this family, implements {key}: {value!r} only"
            )
    kept = {k: v for k, v in config.items() if k not in _JINA_DROPPED}
    theta = float(config.get("rotary_emb_base", 10000.0))
    kept.update(
        model_type="jina_embeddings_v3",
        architectures=["JinaEmbeddingsV3Model"],
        rope_parameters={"rope_type": "default", "rope_theta": theta},
    )
    return kept


def _weight_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.safetensors"))


def jina_weights(view: Path) -> None:
    """Write the view's two weight files, split from the checkpoint's on first use: the base
    under plain names (`<layer>.weight` for a parametrized layer) and the LoRA factors under
    theirs. Reading the whole checkpoint takes seconds, so a load does it, never detection."""
    if (view / _WEIGHTS).is_file() and (view / LORA_FILE).is_file():
        return
    source = (view / _SOURCE).resolve()
    files = _weight_files(source)
    if not files:
        raise ModelUnavailable(f"jina-embeddings-v3 layout in {source} without safetensors weights")
    base, lora = _split(files)
    for name, tensors in ((LORA_FILE, lora), (_WEIGHTS, base)):  # the base last: it marks the split done
        _save_whole(tensors, view / name)


def _split(files: list[Path]) -> tuple[dict[str, Any], dict[str, Any]]:
    from safetensors import safe_open

    base, lora = {}, {}
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (a safetensors handle is not a mapping)
                tensor = handle.get_tensor(name)
                if ".lora_" in name:
                    lora[name] = tensor
                else:
                    base[name.replace(f"{_PARAMETRIZED}original", ".weight")] = tensor
    return base, lora


def _save_whole(tensors: dict[str, Any], path: Path) -> None:
    """`tensors` in `path`, written beside it then renamed into place (two loads may race)."""
    from safetensors.torch import save_file

    handle, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    os.close(handle)
    try:
        save_file(tensors, staging, metadata={"format": "pt"})
        os.chmod(staging, 0o644)  # as the view's other files, not mkstemp's owner-only mode
        os.replace(staging, path)
    except OSError as error:
        raise ModelUnavailable(
            f"cannot write {path.name} of jina-embeddings-v3's view in {path.parent}: {error}"
        ) from error
    finally:
        Path(staging).unlink(missing_ok=True)


def _write_view(directory: Path, view: Path, config_text: str, split: bool = False) -> None:
    """Links to every entry of `directory` but config.json, written whole then renamed into place.
    With `split`, the weight files are left out for `jina_weights`, the ONNX graphs too, and the
    directory linked as the view's source."""
    view.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=view.parent, prefix=".staging-"))
    split_out = {p.name for p in _weight_files(directory)} | {_INDEX, "onnx"}
    skipped = {"config.json"} | (split_out if split else set())
    try:
        for entry in directory.iterdir():
            if entry.name not in skipped:
                (staging / entry.name).symlink_to(entry.resolve())
        if split:
            (staging / _SOURCE).symlink_to(directory.resolve(), target_is_directory=True)
        (staging / "config.json").write_text(config_text, encoding="utf-8")
        os.replace(staging, view)
    except OSError as error:
        if not (view / "config.json").is_file():  # another load wrote the same view first: use it
            raise ModelUnavailable(f"cannot lay out transformers' view of {directory} in {view}: {error}") from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)
