"""A PEFT adapter published alone and the base model it adapts, laid out as one model.

nomic-embed-multimodal's directory holds a LoRA adapter (adapter_config.json and
adapter_model.safetensors) and the processor's files; the weights it adapts are its base model's,
published apart (Qwen/Qwen2.5-VL-3B-Instruct, -7B-Instruct). The entry's `base_model` names
them (a directory, a relative one inside the adapter's as `adapters` are, or a hub id); unset,
adapter_config.json's `base_model_name_or_path` is looked up as a `source` is (a directory, the
local hub cache, else a download unless HF_HUB_OFFLINE).
The layout's `root` is the adapter's directory, its `transformer_dir` the base's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from model_registry.config import ModelSpec
from model_registry.detection import rules
from model_registry.detection.layout import Layout, read_json
from model_registry.errors import ModelUnavailable
from model_registry.types import Kind
from model_registry.zoo.sources import find_in_cache, hub_cache_dir, offline, resolve_source

#: The base models nomic-embed-multimodal adapts: Qwen2.5-VL's.
BASE_MODEL_TYPE = "qwen2_5_vl"


def base_directory(root: Path, spec: ModelSpec, *, download: bool = True) -> Path:
    """The directory of the base model of the adapter in `root`, downloaded where it is a hub id
    not cached and `download` allows; else `ModelUnavailable` naming the model, the base it lacks
    and the setting that gives it."""
    settings = read_json(root / "adapter_config.json")
    named = settings.get("base_model_name_or_path")
    given = spec.base_model or (str(named) if named else None)
    said = "`base_model`" if spec.base_model else "adapter_config.json's base_model_name_or_path"
    if not given:
        raise ModelUnavailable(
            f"model '{spec.name}': the PEFT adapter in {root} names no base model (no base_model_name_or_path in its "
            "adapter_config.json): set `base_model:` in the model's entry to the base model's directory or hub id"
        )
    inside = root / given if spec.base_model and not Path(given).expanduser().is_absolute() else None
    for path in (inside, Path(given).expanduser()):
        if path is not None and path.is_dir():
            return path.resolve()
    repo, _, pinned = given.partition("@")
    revision = pinned or (None if spec.base_model else settings.get("revision") or None)
    cached = find_in_cache(repo, revision) if _hub_id(given) else None
    if cached is not None:
        return cached
    if _hub_id(given) and download and not offline():
        return resolve_source(given, revision=revision)
    raise ModelUnavailable(_missing(spec, root, given, said))


def fetch_base(root: Path, spec: ModelSpec) -> Path | None:
    """The base model of the nomic-embed-multimodal adapter in `root`, found or downloaded as a load
    would (`infinity-server download` fetches it with the adapter); None where `root` holds no
    such adapter. `ModelUnavailable` where the base cannot be had."""
    from model_registry.detection.layout import read_facts
    from model_registry.families.nomic_multimodal import is_nomic_multimodal

    if not is_nomic_multimodal(read_facts(root, spec)):
        return None
    return base_directory(root, spec)


def needs_download(root: Path, spec: ModelSpec) -> bool:
    """Whether the base model is a hub id not cached yet that a load would download."""
    settings = read_json(root / "adapter_config.json")
    given = spec.base_model or str(settings.get("base_model_name_or_path") or "")
    if not given or Path(given).expanduser().is_dir() or not _hub_id(given) or offline():
        return False
    repo, _, pinned = given.partition("@")
    return find_in_cache(repo, pinned or None) is None


def _hub_id(given: str) -> bool:
    return not given.startswith((".", "/", "~")) and given.count("/") == 1


def _missing(spec: ModelSpec, root: Path, given: str, said: str) -> str:
    where = f"nor in the local hub cache ({hub_cache_dir()})" if _hub_id(given) else "nor a hub id"
    why = ", and HF_HUB_OFFLINE keeps it from being downloaded" if _hub_id(given) and offline() else ""
    return (
        f"model '{spec.name}': {root} is a PEFT LoRA adapter without its base model: {given} ({said}) is neither a "
        f"directory {where}{why}. Set `base_model:` in the model's entry to the base model's directory (or a hub id "
        f"to download), or download {given} into the hub cache"
    )


def nomic_multimodal_layout(root: Path, spec: ModelSpec, facts: rules.Facts, modules: Any) -> Layout:
    """The adapter in `root` over its base model: the base's config, the entry's settings."""
    if spec.adapters:
        raise ModelUnavailable(
            f"model '{spec.name}': `adapters` (LoRA adapters chosen per request) are not served on "
            "nomic-embed-multimodal, itself an adapter merged into its base"
        )
    if spec.pooling not in (None, "lasttoken") or spec.normalize is False:
        raise ModelUnavailable(
            f"model '{spec.name}': nomic-embed-multimodal's vector is its last token's, L2-normalised; the entry "
            f"asks for pooling {spec.pooling!r} and normalize {spec.normalize!r}"
        )
    base = base_directory(root, spec)
    config = read_json(base / "config.json")
    if config.get("model_type") != BASE_MODEL_TYPE:
        raise ModelUnavailable(
            f"model '{spec.name}': the base model of the adapter in {root} is Qwen2.5-VL (model_type "
            f"{BASE_MODEL_TYPE}); {base} holds model_type {config.get('model_type') or 'none'} (no config.json?)"
        )
    architectures = tuple(str(a) for a in config.get("architectures") or ())
    prompts = dict(spec.prompts or {})
    return Layout(
        root=root,
        kind=Kind.DENSE,
        transformer_dir=base,
        model_type=BASE_MODEL_TYPE,
        architectures=architectures,
        pooling="lasttoken",
        normalize=True,
        max_length=spec.max_length,
        prompts=prompts,
        default_prompt_name=spec.default_prompt_name,
        query_prompt_name=spec.query_prompt_name or ("query" if "query" in prompts else None),
        config=config,
        options=dict(spec.options),
        notes={"base_model": str(base)},
        family="nomic_multimodal",
    )
