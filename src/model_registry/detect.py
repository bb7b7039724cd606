"""What a model directory is, read from its own files (no weights are loaded here).

sentence-transformers layout: `modules.json` lists the modules (Transformer, Pooling, Dense,
Normalize); `sentence_bert_config.json` holds max_seq_length and do_lower_case;
`config_sentence_transformers.json` holds prompts and the default prompt name.
Plain transformers directories are recognised by `config.json`'s architectures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from model_registry.config import ModelSpec
from model_registry.errors import ModelUnavailable
from model_registry.llm_rerank import RerankPrompt
from model_registry.types import Kind

_DECODER_TYPES = {
    "qwen2",
    "qwen3",
    "llama",
    "mistral",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "gpt2",
    "gpt_neox",
    "falcon",
    "stablelm",
    "olmo",
    "olmo2",
}
_ST_TRANSFORMER = "sentence_transformers.models.Transformer"
_ST_POOLING = "sentence_transformers.models.Pooling"
_ST_DENSE = "sentence_transformers.models.Dense"
_ST_NORMALIZE = "sentence_transformers.models.Normalize"
_LEGACY_POOLING = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


@dataclass(frozen=True)
class DenseLayer:
    path: Path
    in_features: int
    out_features: int
    bias: bool
    activation: str


@dataclass(frozen=True)
class Layout:
    """Everything detection learns about a directory; config overrides are already applied."""

    root: Path
    kind: Kind
    transformer_dir: Path
    model_type: str
    architectures: tuple[str, ...]
    pooling: str = "mean"
    include_prompt: bool = True
    normalize: bool = False
    max_length: int | None = None
    do_lower_case: bool = False
    dense_layers: tuple[DenseLayer, ...] = ()
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    query_prompt_name: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    modules: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    #: A causal LM served as a reranker: its prompt and scoring tokens (see `llm_rerank`).
    rerank_prompt: RerankPrompt | None = None
    #: The checkpoint's own code runs (`trust_remote_code: true` and the code is here).
    remote_code: bool = False
    #: Facts for `/models`: the catalogue record matched, where the model's code comes from.
    notes: dict[str, str] = field(default_factory=dict)


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        raise ModelUnavailable(f"cannot read {path.name} in {path.parent}: {error}") from error
    if not isinstance(data, dict):
        raise ModelUnavailable(f"{path} is not a JSON object")
    return data


def _pooling_from_config(config: dict[str, Any]) -> tuple[str, bool]:
    mode = config.get("pooling_mode")
    if isinstance(mode, list):
        mode = mode[0] if len(mode) == 1 else None
    if mode is None:
        active = [name for key, name in _LEGACY_POOLING.items() if config.get(key)]
        if len(active) > 1:
            raise ModelUnavailable(f"combined pooling modes {active} are not supported")
        mode = active[0] if active else "mean"
    return str(mode), bool(config.get("include_prompt", True))


def _dense_layer(path: Path) -> DenseLayer:
    config = read_json(path / "config.json")
    try:
        return DenseLayer(
            path=path,
            in_features=int(config["in_features"]),
            out_features=int(config["out_features"]),
            bias=bool(config.get("bias", True)),
            activation=str(config.get("activation_function", "torch.nn.modules.linear.Identity")),
        )
    except KeyError as error:
        raise ModelUnavailable(f"{path}/config.json lacks {error}") from error


def _sentence_transformers(root: Path, modules: list[dict[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {"dense_layers": [], "normalize": False, "modules": []}
    for module in modules:
        kind, sub = str(module.get("type", "")), root / str(module.get("path", ""))
        found["modules"].append(kind.rsplit(".", 1)[-1])
        if kind == _ST_TRANSFORMER or kind.endswith("models.Transformer") or kind.endswith("_st.Transformer"):
            found["transformer_dir"] = sub
            st_config = read_json(sub / "sentence_bert_config.json") or read_json(root / "sentence_bert_config.json")
            found["max_length"] = st_config.get("max_seq_length")
            found["do_lower_case"] = bool(st_config.get("do_lower_case", False))
        elif kind == _ST_POOLING or kind.endswith("models.Pooling"):
            found["pooling"], found["include_prompt"] = _pooling_from_config(read_json(sub / "config.json"))
        elif kind == _ST_DENSE or kind.endswith("models.Dense"):
            found["dense_layers"].append(_dense_layer(sub))
        elif kind == _ST_NORMALIZE or kind.endswith("models.Normalize"):
            found["normalize"] = True
    return found


_MEDIA_KINDS = {
    "clip": Kind.IMAGE_TEXT,
    "siglip": Kind.IMAGE_TEXT,
    "siglip2": Kind.IMAGE_TEXT,
    "clap": Kind.AUDIO_TEXT,
    "colpali": Kind.PAGE_TEXT,
    "colqwen2": Kind.PAGE_TEXT,
}
_MEDIA_ARCHITECTURES = {
    "CLIPModel": Kind.IMAGE_TEXT,
    "SiglipModel": Kind.IMAGE_TEXT,
    "Siglip2Model": Kind.IMAGE_TEXT,
    "ClapModel": Kind.AUDIO_TEXT,
    "ColPaliForRetrieval": Kind.PAGE_TEXT,
    "ColQwen2ForRetrieval": Kind.PAGE_TEXT,
}


def _kind_from_architectures(model_type: str, architectures: tuple[str, ...]) -> Kind:
    media = [_MEDIA_ARCHITECTURES[a] for a in architectures if a in _MEDIA_ARCHITECTURES]
    if media or model_type in _MEDIA_KINDS:
        return media[0] if media else _MEDIA_KINDS[model_type]
    if any(arch.endswith("ForSequenceClassification") for arch in architectures):
        return Kind.RERANKER
    return Kind.DENSE


def _auto_kind(
    root: Path, config: dict[str, Any], found: dict[str, Any], model_type: str, architectures: tuple[str, ...]
) -> Kind:
    from model_registry.detect_zoo import is_causal_lm, zoo_kind

    kind = zoo_kind(root, config, found.get("modules", ())) or _kind_from_architectures(model_type, architectures)
    if kind == Kind.DENSE and "Pooling" not in found.get("modules", ()) and is_causal_lm(architectures):
        raise ModelUnavailable(
            f"{root} holds a causal language model ({', '.join(architectures)}) with no sentence-transformers "
            "pooling: its files do not say it embeds text. Set `kind: reranker` for a yes/no LLM reranker "
            "(Qwen3-Reranker, bge-reranker-v2-gemma, mxbai-rerank-v2), or `kind: dense` with `pooling: lasttoken` "
            "for an embedder whose files lack the sentence-transformers modules."
        )
    if kind == Kind.DENSE and "Pooling" not in found.get("modules", ()) and _masked_lm_only(architectures):
        raise ModelUnavailable(
            f"{root} holds a bare masked-language model ({', '.join(architectures)}) with no pooling configured: "
            "it may be a SPLADE checkpoint or an encoder that was never trained for embeddings, and the files "
            "do not say which. Set `kind: sparse` for SPLADE, or `kind: dense` to mean-pool its hidden states."
        )
    return kind


def _masked_lm_only(architectures: tuple[str, ...]) -> bool:
    return bool(architectures) and all(a.endswith("ForMaskedLM") for a in architectures)


def detect(root: Path, spec: ModelSpec) -> Layout:
    """Detect the layout of `root`, then apply the overrides that `spec` sets."""
    modules = json.loads((root / "modules.json").read_text()) if (root / "modules.json").is_file() else None
    found = _sentence_transformers(root, modules) if isinstance(modules, list) else {}
    transformer_dir = Path(found.get("transformer_dir", root))
    if not (transformer_dir / "config.json").is_file() and (root / "open_clip_config.json").is_file():
        return open_clip_layout(root, spec)
    config = read_json(transformer_dir / "config.json")
    if not config and spec.kind != Kind.FAKE:
        raise ModelUnavailable(f"no config.json in {transformer_dir}: not a transformers model directory")
    model_type = str(config.get("model_type", ""))
    architectures = tuple(str(a) for a in config.get("architectures") or ())
    decoder = model_type in _DECODER_TYPES
    remote, notes = _code_origin((root, transformer_dir), config, modules, model_type, spec)
    if "pooling" not in found:
        found["pooling"] = "lasttoken" if decoder else "mean"
        found.setdefault("normalize", True)
    st_extra = read_json(root / "config_sentence_transformers.json")
    kind = spec.kind if spec.kind != "auto" else _auto_kind(root, config, found, model_type, architectures)
    prompts = dict(st_extra.get("prompts") or {})
    prompts.update(spec.prompts or {})
    return Layout(
        root=root,
        kind=kind,
        transformer_dir=transformer_dir,
        model_type=model_type,
        architectures=architectures,
        pooling=spec.pooling or found["pooling"],
        include_prompt=found.get("include_prompt", True),
        normalize=spec.normalize if spec.normalize is not None else found.get("normalize", False),
        max_length=spec.max_length or found.get("max_length"),
        do_lower_case=found.get("do_lower_case", False),
        dense_layers=tuple(found.get("dense_layers", ())),
        prompts=prompts,
        default_prompt_name=spec.default_prompt_name or st_extra.get("default_prompt_name"),
        query_prompt_name=spec.query_prompt_name or ("query" if "query" in prompts else None),
        config=config,
        modules=tuple(found.get("modules", ())),
        options=dict(spec.options),
        rerank_prompt=_rerank_prompt(transformer_dir, kind, model_type, architectures, spec),
        remote_code=remote,
        notes=notes,
    )


def _code_origin(
    roots: tuple[Path, Path], config: dict[str, Any], modules: Any, model_type: str, spec: ModelSpec
) -> tuple[bool, dict[str, str]]:
    """Whether the checkpoint's own code runs, and the notes `/models` shows about it."""
    from model_registry.catalogue import match
    from model_registry.detect_zoo import check_remote_code, native_port, remote_classes

    record = match(spec.source)
    notes = {"catalogue": record.id} if record else {}
    types = [str(m.get("type", "")) for m in modules if isinstance(m, dict)] if isinstance(modules, list) else []
    classes = remote_classes(config, types)
    if native_port(model_type) is not None:
        unused = " (the checkpoint's hub code is not run)" if classes else ""
        notes["code"] = f"transformers' native {model_type} port{unused}"
        return False, notes
    unsupported = [t for t in types if t in classes and not t.endswith(".Transformer")]
    if unsupported:
        raise ModelUnavailable(
            f"modules.json names {', '.join(unsupported)}: this server runs sentence-transformers' own "
            "Pooling, Dense and Normalize modules, not a checkpoint's own"
        )
    check_remote_code(roots, classes, spec.trust_remote_code)
    if classes:
        notes["code"] = f"the checkpoint's own code ({', '.join(classes[:3])}), trust_remote_code: true"
    return bool(classes), notes


def _rerank_prompt(
    directory: Path, kind: Kind, model_type: str, architectures: tuple[str, ...], spec: ModelSpec
) -> RerankPrompt | None:
    """The prompt of a causal LM served as a reranker; the prompt keys on any other model are refused."""
    from model_registry.detect_zoo import is_causal_lm
    from model_registry.llm_rerank import resolve

    overrides = spec.rerank_overrides()
    if kind == Kind.RERANKER and is_causal_lm(architectures):
        return resolve(directory, model_type, architectures, read_json(directory / "tokenizer_config.json"), overrides)
    if any(value is not None for value in overrides.values()):
        keys = ", ".join(sorted(k for k, v in overrides.items() if v is not None))
        raise ModelUnavailable(
            f"{keys} apply to LLM rerankers (a causal LM with kind: reranker); this model is a "
            f"{kind.value} model ({', '.join(architectures) or model_type})"
        )
    return None


def open_clip_layout(root: Path, spec: ModelSpec) -> Layout:
    """An open_clip directory: `open_clip_config.json` (model_cfg, preprocess_cfg) and its weights."""
    config = read_json(root / "open_clip_config.json")
    if not isinstance(config.get("model_cfg"), dict):
        raise ModelUnavailable(f"{root / 'open_clip_config.json'} has no 'model_cfg' object")
    kind = spec.kind if spec.kind != "auto" else Kind.IMAGE_TEXT
    return Layout(root=root, kind=kind, transformer_dir=root, model_type="open_clip", architectures=(), config=config)
