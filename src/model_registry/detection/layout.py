"""What a model directory is, read from its own files (no weights are loaded here).

sentence-transformers layout: `modules.json` lists the modules (Transformer, Pooling, Dense,
Normalize); `sentence_bert_config.json` holds max_seq_length and do_lower_case;
`config_sentence_transformers.json` holds prompts, the default prompt name, `truncate_dim` and the
similarity function (`similarity_fn_name`).
Plain transformers directories are recognised by `config.json`'s architectures; static embedding
models (model2vec's layout, sentence-transformers' StaticEmbedding) by their own files.
"""

from __future__ import annotations

import ast
import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from model_registry import families
from model_registry.config import ModelSpec
from model_registry.detection import rules
from model_registry.errors import ModelUnavailable
from model_registry.families.ports import port_directory
from model_registry.types import Kind, Similarity
from model_registry.zoo.rerank_templates import RerankPrompt

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
#: The sentence-transformers modules an embedder's pipeline runs, in this order (Dropout does
#: nothing at inference); any other module of the library, or another order, is refused.
_ST_PIPELINE = ("Transformer", "Pooling", "Dense", "Normalize")
#: sentence-transformers' input modules that hold no transformers model to read.
_NO_MODEL_DIRECTORY = frozenset({"Router", "Asym", "WordEmbeddings", "BoW"})
#: sentence-transformers' module that sends each input down one of several module chains (`Asym`
#: is its former name), and where it keeps its routes (`config.json` before it was renamed).
_ROUTERS = frozenset({"Router", "Asym"})
_ROUTER_CONFIGS = ("router_config.json", "config.json")
#: The masked-LM Transformer of sentence-transformers' SparseEncoder releases before 6.
_MLM_TRANSFORMER = "MLMTransformer"
#: What a static model's modules.json may hold after its StaticEmbedding (Dropout does nothing at inference).
_STATIC_AFTER = frozenset({"Normalize", "Dropout"})
#: model2vec's `max_length` where its config.json has none (`StaticModel`'s DEFAULT_MAX_LENGTH).
_MODEL2VEC_MAX_LENGTH = 512
#: Where sentence-transformers versions before 3 kept the Transformer's settings.
_ST_CONFIGS = tuple(
    f"sentence_{name}_config.json"
    for name in ("bert", "xlm-roberta", "roberta", "distilbert", "camembert", "albert", "xlnet")
)
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
    #: sentence-transformers' `truncate_dim`: vectors are cut to their first components, as saved.
    truncate_dim: int | None = None
    #: sentence-transformers' `similarity_fn_name`: how a dense embedder's vectors score in a rerank.
    similarity: Similarity = Similarity.COSINE
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    query_prompt_name: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    modules: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    #: The entry's PEFT adapters: name -> directory (the `peft_lora` family).
    adapters: dict[str, str] = field(default_factory=dict)
    #: A causal LM served as a reranker: its prompt and scoring tokens (see `zoo.rerank_templates`).
    rerank_prompt: RerankPrompt | None = None
    #: The checkpoint's own code runs (`trust_remote_code: true` and the code is here).
    remote_code: bool = False
    #: Facts for `/models`: the catalogue record matched, where the model's code comes from.
    notes: dict[str, str] = field(default_factory=dict)
    #: The adapter of a layout served unlike its kind's default (`detection.rules`' family stage).
    family: str | None = None
    #: Each sentence-transformers module's directory, by class name (SpladePooling's config, ...).
    module_dirs: dict[str, Path] = field(default_factory=dict)
    #: A Router's module chains (family "router"): each route's own layout, the route an input
    #: naming none takes (None: it must name one), and route_mappings' (task, modality) -> route.
    routes: dict[str, Layout] = field(default_factory=dict)
    default_route: str | None = None
    route_mappings: dict[tuple[str | None, str | None], str] = field(default_factory=dict)


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


def _dense_unserved(path: Path) -> str | None:
    """What of a Dense module the pipeline does not serve: one that reads or writes another output
    than the sentence embedding (sentence-transformers' `module_input_name`, `module_output_name`)."""
    config = read_json(path / "config.json")
    into, out = config.get("module_input_name"), config.get("module_output_name")
    if into in (None, "sentence_embedding") and out in (None, "sentence_embedding"):
        return None
    return f"a Dense module from '{into}' to '{out}' (only one on the sentence embedding is served)"


def st_class(kind: str) -> str | None:
    """The class name of a sentence-transformers module type in any of the library's layouts
    (`sentence_transformers.models.Dense` before 6.0, `sentence_transformers.base.modules.dense.Dense`
    since) or of the forks that keep its names (`*.models.Transformer`, `*_st.Transformer`); None
    for other code."""
    name = kind.rsplit(".", 1)[-1]
    if kind.startswith("sentence_transformers.") or kind.endswith(f"models.{name}") or kind.endswith("_st.Transformer"):
        return name
    return None


def _sentence_transformers(root: Path, modules: list[dict[str, Any]]) -> dict[str, Any]:
    """What modules.json's modules say of an embedder's pipeline; `unserved` lists what of it the
    pipeline would not run as sentence-transformers does (refused for dense models)."""
    found: dict[str, Any] = {"dense_layers": [], "normalize": False, "modules": [], "unserved": [], "dirs": {}}
    reached = -1  # the furthest stage of `_ST_PIPELINE` met so far
    for module in modules:
        kind, sub = str(module.get("type", "")), root / str(module.get("path", ""))
        found["modules"].append(kind.rsplit(".", 1)[-1])
        name = st_class(kind)
        if name is None or name == "Dropout":
            continue
        found["dirs"].setdefault(name, sub)
        found.setdefault("classes", []).append(name)
        if name == _MLM_TRANSFORMER:  # read as the Transformer it is, served by the sparse kind only
            _read_module(found, "Transformer", root, sub)
        if name not in _ST_PIPELINE:
            found["unserved"].append(f"the {name} module")
            continue
        stage = _ST_PIPELINE.index(name)
        if stage < reached or (stage == reached and name != "Dense"):
            found["unserved"].append(f"{name} after {_ST_PIPELINE[reached]}")
        reached = max(reached, stage)
        _read_module(found, name, root, sub)
    return found


def _read_module(found: dict[str, Any], name: str, root: Path, sub: Path) -> None:
    if name == "Transformer":
        found["transformer_dir"] = sub
        st_config = next((c for c in (_read_first(d) for d in (sub, root)) if c), {})
        found["max_length"] = st_config.get("max_seq_length")
        found["do_lower_case"] = bool(st_config.get("do_lower_case", False))
    elif name == "Pooling":
        found["pooling"], found["include_prompt"] = _pooling_from_config(read_json(sub / "config.json"))
    elif name == "Dense":
        found["dense_layers"].append(_dense_layer(sub))
        unserved = _dense_unserved(sub)
        if unserved is not None:
            found["unserved"].append(unserved)
    else:
        found["normalize"] = True


def _read_first(directory: Path) -> dict[str, Any]:
    """The Transformer's settings in `directory`, under any of the names the library reads."""
    return next((c for c in (read_json(directory / name) for name in _ST_CONFIGS) if c), {})


def _truncate_dim(st_extra: dict[str, Any], kind: Kind) -> int | None:
    """config_sentence_transformers.json's `truncate_dim`, which dense models apply; another kind
    with one is refused rather than answered whole."""
    value = st_extra.get("truncate_dim")
    if value is None:
        return None
    if kind != Kind.DENSE or not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ModelUnavailable(
            f"config_sentence_transformers.json sets truncate_dim {value!r}, which this server applies to dense "
            "embedders only (a positive count of components)"
        )
    return value


def _similarity(root: Path, st_extra: dict[str, Any], kind: Kind) -> Similarity:
    """config_sentence_transformers.json's `similarity_fn_name` for a dense embedder, cosine where
    it names none, as sentence-transformers defaults. Other kinds score as their kind defines
    (SPLADE and PyLate save "dot" and "MaxSim" there), so only a dense model's is read."""
    value = st_extra.get("similarity_fn_name")
    if kind != Kind.DENSE or value is None:
        return Similarity.COSINE
    accepted = tuple(s.value for s in Similarity)
    if value not in accepted:  # a tuple: the value may be any JSON, a list included
        raise ModelUnavailable(
            f"{root / 'config_sentence_transformers.json'} sets similarity_fn_name {value!r}, which a dense "
            f"embedder cannot score by; accepted: {', '.join(map(repr, accepted))} (sentence-transformers' "
            "SentenceTransformer functions), or no key for cosine"
        )
    return Similarity(value)


def _refuse_unserved(root: Path, found: dict[str, Any]) -> None:
    if found.get("unserved"):
        raise ModelUnavailable(
            f"{root}/modules.json has {', '.join(found['unserved'])}: this server's embedders run "
            "sentence-transformers' Transformer, Pooling, Dense and Normalize modules, in that order, and "
            "would answer other vectors than the model's"
        )


#: A SparseEncoder's modules the SPLADE adapter runs: the masked LM, then SpladePooling.
_SPLADE_PIPELINE = ("Transformer", "MLMTransformer", "SpladePooling")


def _refuse_unserved_sparse(root: Path, classes: list[str]) -> None:
    """A SparseEncoder pipeline with more than a masked LM and SpladePooling (a SparseAutoEncoder,
    say) is refused: the SPLADE adapter would answer other weights than the model's."""
    if "SpladePooling" not in classes and "MLMTransformer" not in classes:
        return
    other = [name for name in classes if name not in _SPLADE_PIPELINE]
    if other:
        raise ModelUnavailable(
            f"{root} has sentence-transformers' {', '.join(other)} module in its SparseEncoder pipeline: this "
            "server's SPLADE models run a masked-LM Transformer then SpladePooling, and would answer other "
            "weights than the model's"
        )


def detect(root: Path, spec: ModelSpec) -> Layout:
    """Detect the layout of `root` by the rules of `detection.rules`, then apply the overrides that
    `spec` sets."""
    modules = _modules(root)
    if _router_entry(modules) is not None:
        return router_layout(root, spec, modules)
    return _detect(root, spec, modules)


def _detect(root: Path, spec: ModelSpec, modules: Any) -> Layout:
    """`detect` for the modules listed in `modules` (a Router's route, or modules.json's own)."""
    found = _sentence_transformers(root, modules) if isinstance(modules, list) else {}
    if set(found.get("modules", ())) & _NO_MODEL_DIRECTORY:  # else a missing config.json would be the error
        _refuse_unserved(root, found)
    facts = _facts(root, Path(found.get("transformer_dir", root)), modules, spec)
    claimed = rules.first(facts, "layout")
    if claimed is not None:  # a family that reads its directory itself
        return _layout_builder(claimed)(root, spec, facts, modules)
    origin = rules.origin(facts)
    transformer_dir, config = facts.transformer_dir, facts.config
    if origin.port:
        transformer_dir, config = port_directory(transformer_dir, config)
    model_type = str(config.get("model_type", ""))
    if "pooling" not in found:
        found["pooling"] = "lasttoken" if model_type in _DECODER_TYPES else "mean"
        found.setdefault("normalize", True)
    kind = facts.kind or rules.kind(facts)
    if kind == Kind.DENSE:
        _refuse_unserved(root, found)
    if kind == Kind.SPARSE:
        _refuse_unserved_sparse(root, found.get("classes", []))
    family = rules.family(facts, kind)
    st_extra = read_json(root / "config_sentence_transformers.json")
    return Layout(
        root=root,
        kind=kind,
        transformer_dir=transformer_dir,
        model_type=model_type,
        architectures=facts.architectures,
        pooling=spec.pooling or found["pooling"],
        include_prompt=found.get("include_prompt", True),
        do_lower_case=found.get("do_lower_case", False),
        dense_layers=tuple(found.get("dense_layers", ())),
        config=config,
        modules=facts.modules,
        **_entry_settings(root, spec, st_extra, kind, found.get("normalize", False), found.get("max_length")),
        rerank_prompt=_rerank_prompt(transformer_dir, family, model_type, facts.architectures, spec),
        remote_code=origin.remote,
        notes=_notes(spec, origin),
        family=family,
        module_dirs=dict(found.get("dirs", {})),
    )


def _entry_settings(
    root: Path, spec: ModelSpec, st_extra: dict[str, Any], kind: Kind, normalize: bool, max_length: int | None
) -> dict[str, Any]:
    """The Layout fields the files give and the entry may override: normalisation and length
    (as the files say them: `normalize`, `max_length`), prompts, Matryoshka cut and similarity
    (config_sentence_transformers.json's `st_extra`), and the entry's options."""
    prompts = {**(st_extra.get("prompts") or {}), **(spec.prompts or {})}
    return {
        "normalize": spec.normalize if spec.normalize is not None else normalize,
        "max_length": spec.max_length or max_length,
        "truncate_dim": _truncate_dim(st_extra, kind),
        "similarity": _similarity(root, st_extra, kind),
        "prompts": prompts,
        "default_prompt_name": spec.default_prompt_name or st_extra.get("default_prompt_name"),
        "query_prompt_name": spec.query_prompt_name or ("query" if "query" in prompts else None),
        "options": dict(spec.options),
        "adapters": dict(spec.adapters or {}),
    }


def read_facts(root: Path, spec: ModelSpec) -> rules.Facts:
    """What the detection rules read of `root`, with the settings of `spec` that bear on them."""
    modules = _modules(root)
    found = _sentence_transformers(root, modules) if isinstance(modules, list) else {}
    return _facts(root, Path(found.get("transformer_dir", root)), modules, spec)


def _modules(root: Path) -> Any:
    path = root / "modules.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _facts(root: Path, transformer_dir: Path, modules: Any, spec: ModelSpec) -> rules.Facts:
    types = [str(m.get("type", "")) for m in modules if isinstance(m, dict)] if isinstance(modules, list) else []
    return rules.Facts(
        root=root,
        transformer_dir=transformer_dir,
        config=read_json(transformer_dir / "config.json"),
        module_types=tuple(types),
        trusted=spec.trust_remote_code,
        rerank_keys=tuple(sorted(k for k, v in spec.rerank_overrides().items() if v is not None)),
        kind=None if spec.kind == "auto" else Kind(spec.kind),
        adapters=tuple(spec.adapters or ()),
        base_model=spec.base_model,
    )


def _notes(spec: ModelSpec, origin: rules.Origin) -> dict[str, str]:
    """Facts for `/models`: the catalogue record matched, where the model's code comes from."""
    from model_registry.zoo.catalogue import match

    record = match(spec.source)
    notes = {"catalogue": record.id} if record else {}
    if origin.note:
        notes["code"] = origin.note
    return notes


def _rerank_prompt(
    directory: Path, family: str | None, model_type: str, architectures: tuple[str, ...], spec: ModelSpec
) -> RerankPrompt | None:
    """The prompt of a causal LM served as a reranker (the `llm-reranker` family), or
    Qwen3-VL-Reranker's, whose entry may set its default instruction."""
    from model_registry.zoo.rerank_templates import qwen3_vl_prompt, resolve

    if family == "qwen3_vl_reranker":
        return qwen3_vl_prompt(spec.instruction)
    if family != "llm_reranker":
        return None
    tokenizer_config = read_json(directory / "tokenizer_config.json")
    return resolve(directory, model_type, architectures, tokenizer_config, spec.rerank_overrides())


def _layout_builder(claimed: rules.Rule) -> Callable[[Path, ModelSpec, rules.Facts, Any], Layout]:
    """The layout function of the family a layout-stage rule claims the directory for."""
    assert claimed.family is not None, f"This is a bug: layout rule {claimed.name} claims no family"
    target = families.by_name(claimed.family).layout
    assert target is not None, f"This is a bug: family {claimed.family} declares no layout"
    module, _, name = target.partition(":")
    builder: Callable[[Path, ModelSpec, rules.Facts, Any], Layout] = getattr(importlib.import_module(module), name)
    return builder


def open_clip_layout(root: Path, spec: ModelSpec, facts: rules.Facts, modules: Any) -> Layout:
    """An open_clip directory: `open_clip_config.json` (model_cfg, preprocess_cfg) and its weights."""
    config = read_json(root / "open_clip_config.json")
    if not isinstance(config.get("model_cfg"), dict):
        raise ModelUnavailable(f"{root / 'open_clip_config.json'} has no 'model_cfg' object")
    kind = spec.kind if spec.kind != "auto" else Kind.IMAGE_TEXT
    return Layout(
        root=root,
        kind=kind,
        transformer_dir=root,
        model_type="open_clip",
        architectures=(),
        config=config,
        family="open_clip",
    )


def static_layout(root: Path, spec: ModelSpec, facts: rules.Facts, modules: Any) -> Layout:
    """A static embedding model: model2vec's layout (config.json `model_type: model2vec`, read as
    model2vec reads it whatever modules.json it also has) or sentence-transformers' StaticEmbedding
    module, optionally followed by Normalize (read as sentence-transformers reads it)."""
    rules.family(facts, Kind.DENSE)  # refuses the keys of other families (an LLM reranker's template)
    if spec.pooling not in (None, "mean"):
        raise ModelUnavailable(
            f"{root} holds a static embedding model, the mean of its tokens' vectors: pooling {spec.pooling!r} "
            "does not apply to it; remove the key"
        )
    st_extra: dict[str, Any] = {}
    if facts.model_type == "model2vec":
        config, directory, model_type = facts.config, root, "model2vec"
        normalize, max_length = _model2vec_settings(root, config)
    else:
        directory, normalize = _static_modules(root, modules)
        config, model_type, max_length = {"model_type": "static_embedding"}, "static_embedding", None
        st_extra = read_json(root / "config_sentence_transformers.json")
    return Layout(
        root=root,
        kind=Kind.DENSE,
        transformer_dir=directory,
        model_type=model_type,
        architectures=facts.architectures,
        config=config,
        modules=facts.modules,
        **_entry_settings(root, spec, st_extra, Kind.DENSE, normalize, max_length),
        notes=_notes(spec, rules.Origin()),
        family="static",
    )


def _model2vec_settings(root: Path, config: dict[str, Any]) -> tuple[bool, int | None]:
    """config.json's `normalize` (false where absent) and `max_length` (512 where absent; null: no
    limit), the two keys model2vec's `encode` reads."""
    normalize = config.get("normalize", False)
    max_length = config.get("max_length", _MODEL2VEC_MAX_LENGTH)
    if not isinstance(normalize, bool):
        raise ModelUnavailable(f"{root / 'config.json'} sets normalize {normalize!r}; model2vec takes true or false")
    if max_length is not None and (not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1):
        raise ModelUnavailable(
            f"{root / 'config.json'} sets max_length {max_length!r}; model2vec takes a positive count of tokens, "
            "or null for no limit"
        )
    return normalize, max_length


def _static_modules(root: Path, modules: Any) -> tuple[Path, bool]:
    """The StaticEmbedding module's directory, and whether a Normalize follows it."""
    entries = [m for m in modules if isinstance(m, dict)] if isinstance(modules, list) else []
    names = [st_class(str(m.get("type", ""))) or str(m.get("type", "")) for m in entries]
    if names[:1] != ["StaticEmbedding"] or set(names[1:]) - _STATIC_AFTER:
        raise ModelUnavailable(
            f"{root}/modules.json has {', '.join(names)}: a static embedding model here runs sentence-transformers' "
            "StaticEmbedding module, then Normalize if it has one, and would answer other vectors than the model's"
        )
    return root / str(entries[0].get("path", "")), "Normalize" in names


def sparse_static_layout(root: Path, spec: ModelSpec, facts: rules.Facts, modules: Any) -> Layout:
    """sentence-transformers' SparseStaticEmbedding alone: a weight per vocabulary token (an IDF
    table), a text's vector the weights of the tokens it holds (the query side of an
    inference-free sparse model)."""
    entries = [m for m in modules if isinstance(m, dict)] if isinstance(modules, list) else []
    names = [st_class(str(m.get("type", ""))) or str(m.get("type", "")) for m in entries]
    if names != ["SparseStaticEmbedding"]:
        raise ModelUnavailable(
            f"{root} has {', '.join(names)}: a SparseStaticEmbedding module is served alone, as the first and last "
            "module of its chain, and would answer other weights than the model's"
        )
    if spec.pooling is not None:
        raise ModelUnavailable(f"{root} holds a SparseStaticEmbedding module: pooling does not apply; remove the key")
    directory = root / str(entries[0].get("path", ""))
    return Layout(
        root=root,
        kind=Kind.SPARSE,
        transformer_dir=directory,
        model_type="sparse_static",
        architectures=(),
        config={"model_type": "sparse_static"},
        modules=facts.modules,
        **_entry_settings(root, spec, read_json(root / "config_sentence_transformers.json"), Kind.SPARSE, False, None),
        notes=_notes(spec, rules.Origin()),
        family="sparse_static",
        module_dirs={"SparseStaticEmbedding": directory},
    )


# ---- sentence-transformers' Router ---------------------------------------------------------------


def _router_entry(modules: Any) -> dict[str, Any] | None:
    """modules.json's Router (or Asym) entry when it is the first module, else None."""
    if not isinstance(modules, list) or not modules or not isinstance(modules[0], dict):
        return None
    return modules[0] if st_class(str(modules[0].get("type", ""))) in _ROUTERS else None


def router_layout(root: Path, spec: ModelSpec, modules: list[Any]) -> Layout:
    """A sentence-transformers Router: each route a chain of modules (in its own directory, named
    by its id in the router's config), detected as a model of its own, followed by the modules
    modules.json lists after the Router. Every route must be one this server serves, and all of
    them of one kind."""
    entry = _router_entry(modules)
    assert entry is not None, "This is a bug: router_layout() called without a Router"
    where = root / str(entry.get("path", ""))
    config, path = next(((c, where / n) for n in _ROUTER_CONFIGS if (c := read_json(where / n))), ({}, where))
    types, structure = config.get("types"), config.get("structure")
    if not isinstance(types, dict) or not isinstance(structure, dict) or not structure:
        raise ModelUnavailable(f"{path} does not list the Router's routes ('types' and 'structure')")
    after = [dict(m) for m in modules[1:] if isinstance(m, dict)]
    routes: dict[str, Layout] = {}
    for route, ids in structure.items():
        listed = ids if isinstance(ids, list) else [ids]
        chain = [_route_module(path, types, str(entry.get("path", "")), module) for module in listed]
        try:
            routes[str(route)] = _detect(root, spec, chain + after)
        except ModelUnavailable as error:
            raise ModelUnavailable(f"{root}: the Router's '{route}' route cannot be served: {error}") from None
    kinds = {layout.kind for layout in routes.values()}
    if len(kinds) != 1:
        said = ", ".join(f"'{name}' {layout.kind.value}" for name, layout in routes.items())
        raise ModelUnavailable(f"{root}: the Router's routes are of different kinds ({said}); one kind is served")
    parameters = config.get("parameters") or {}
    default = _default_route(path, parameters, tuple(routes))
    # It reads as its route that runs an engine (the engine tables read that route's files).
    engine = [layout for layout in routes.values() if layout.family not in families.engineless()]
    first = engine[0] if engine else routes[default] if default is not None else next(iter(routes.values()))
    return replace(
        first,
        root=root,
        modules=tuple(str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules if isinstance(m, dict)),
        family="router",
        routes=routes,
        default_route=default,
        route_mappings=_route_mappings(path, parameters, routes),
    )


def _route_module(path: Path, types: dict[str, Any], prefix: str, module: Any) -> dict[str, Any]:
    """One module of a route as modules.json would list it: its type, and its directory."""
    name = str(module)
    if name not in types:
        raise ModelUnavailable(f"{path} names the module '{name}' in a route but not in 'types'")
    if Path(name).is_absolute() or ".." in Path(name).parts:
        raise ModelUnavailable(f"{path} names the module '{name}', a path outside the model's directory")
    return {"type": str(types[name]), "path": str(Path(prefix, name))}


def _default_route(path: Path, parameters: dict[str, Any], routes: tuple[str, ...]) -> str | None:
    """The route an input that names none takes: `default_route`, else (with `allow_empty_key`,
    true by default) the first route, as sentence-transformers' Router decides."""
    default = parameters.get("default_route")
    if default is not None and default not in routes:
        raise ModelUnavailable(f"{path} sets default_route '{default}', which is not one of its routes {list(routes)}")
    if default is None and parameters.get("allow_empty_key", True):
        return routes[0]
    return None if default is None else str(default)


def _route_mappings(
    path: Path, parameters: dict[str, Any], routes: dict[str, Layout]
) -> dict[tuple[str | None, str | None], str]:
    """`route_mappings` as sentence-transformers saves it ("('query', 'text')" -> route); a
    mapping for another modality than text is refused, as no route here reads media."""
    found: dict[tuple[str | None, str | None], str] = {}
    for key, route in (parameters.get("route_mappings") or {}).items():
        try:
            task, modality = ast.literal_eval(str(key))
        except (ValueError, SyntaxError, TypeError):
            raise ModelUnavailable(f"{path} has a route mapping '{key}' that is not a (task, modality) pair") from None
        if route not in routes:
            raise ModelUnavailable(f"{path} maps {key} to '{route}', which is not one of its routes {list(routes)}")
        if modality not in (None, "text"):
            raise ModelUnavailable(
                f"{path} maps the modality {modality!r} to its '{route}' route; the routes served here read text"
            )
        found[(task, modality)] = str(route)
    return found
