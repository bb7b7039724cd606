"""The rules that decide what a model directory is, in the order they are tried.

Each rule is a named predicate over the directory's files (`Facts`) and what follows when it
matches: a kind, a family (the adapter that serves a layout unlike its kind's default), where
the model's code comes from, or a refusal with its message. Four stages run in this order, and
in each the first rule that matches decides:

- `layout`: what kind of directory this is at all (an open_clip checkpoint, a static embedding
  model, or no model);
- `code`: whose code runs the model (transformers' native port of a hub-code family, the
  checkpoint's own code when trusted, or a refusal);
- `kind`: the kind, when the entry leaves `kind: auto` (a directory no rule claims is dense);
- `family`: the adapter of a layout served unlike its kind's default.

`docs/text-zoo.md` lists every rule by name; `tests/unit/test_detect_rules.py` has a directory
that each rule matches and one it must not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from model_registry.detect_zoo import (
    is_causal_lm,
    is_pylate,
    label_count,
    offline_code,
    remote_classes,
    reranker_chat_template,
    untrusted_code,
)
from model_registry.errors import ModelUnavailable
from model_registry.native_ports import is_jina_lora, jina_port, native_port, port_name, unapplied_adapters
from model_registry.types import Kind

Stage = Literal["layout", "code", "kind", "family"]
#: The families computed on numpy and tokenizers alone, by no engine (no torch, no transformers).
ENGINELESS = frozenset({"static", "sparse_static"})
STAGES: tuple[Stage, ...] = ("layout", "code", "kind", "family")


@dataclass(frozen=True)
class Facts:
    """What the rules read: a directory's files, and the entry's settings that bear on them."""

    root: Path
    transformer_dir: Path
    config: dict[str, Any]
    #: modules.json's module types, in order (empty without sentence-transformers modules).
    module_types: tuple[str, ...] = ()
    trusted: bool = False
    #: The LLM reranker keys (`template`, ...) the entry sets.
    rerank_keys: tuple[str, ...] = ()
    #: The configured kind, or the detected one once the kind stage has run.
    kind: Kind | None = None

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", ""))

    @property
    def architectures(self) -> tuple[str, ...]:
        return tuple(str(a) for a in self.config.get("architectures") or ())

    @property
    def modules(self) -> tuple[str, ...]:
        """The modules' class names (`Transformer`, `Pooling`, `Dense`, ...)."""
        return tuple(t.rsplit(".", 1)[-1] for t in self.module_types)

    def has(self, name: str, *, inside: bool = False) -> bool:
        return ((self.transformer_dir if inside else self.root) / name).is_file()

    def remote_classes(self) -> list[str]:
        return remote_classes(self.config, self.module_types)


@dataclass(frozen=True)
class Rule:
    """`when` the files say so, the rule decides: `kind` (a kind, or how to read it from the
    files), `family`, `remote` (code stage: whether the checkpoint's own code runs, with the
    `note` `/models` shows), or `refusal` (the message of the start-up error)."""

    name: str
    stage: Stage
    when: Callable[[Facts], bool]
    #: What follows, as `docs/text-zoo.md` says it.
    says: str
    kind: Kind | Callable[[Facts], Kind] | None = None
    family: str | None = None
    remote: bool | None = None
    #: Code stage: transformers' native port runs the model (`native_ports`).
    port: bool = False
    note: Callable[[Facts], str] | None = None
    refusal: Callable[[Facts], str] | None = None

    def kind_of(self, facts: Facts) -> Kind:
        assert self.kind is not None, f"This is a bug: rule {self.name} decides no kind"
        return self.kind if isinstance(self.kind, Kind) else self.kind(facts)


@dataclass(frozen=True)
class Origin:
    """Whose code runs the model, and what `/models` says about it (None: the library's own)."""

    remote: bool = False
    note: str | None = None
    port: bool = False


_MEDIA_TYPES = {
    "clip": Kind.IMAGE_TEXT,
    "siglip": Kind.IMAGE_TEXT,
    "siglip2": Kind.IMAGE_TEXT,
    "clap": Kind.AUDIO_TEXT,
    "colpali": Kind.PAGE_TEXT,
    "colqwen2": Kind.PAGE_TEXT,
    "colmodernvbert": Kind.PAGE_TEXT,
}
_MEDIA_ARCHITECTURES = {
    "CLIPModel": Kind.IMAGE_TEXT,
    "SiglipModel": Kind.IMAGE_TEXT,
    "Siglip2Model": Kind.IMAGE_TEXT,
    "ClapModel": Kind.AUDIO_TEXT,
    "ColPaliForRetrieval": Kind.PAGE_TEXT,
    "ColQwen2ForRetrieval": Kind.PAGE_TEXT,
    "ColModernVBertForRetrieval": Kind.PAGE_TEXT,
}


def _vision_language(facts: Facts) -> bool:
    """A model with a vision tower that no media family here serves (Qwen3-VL, Qwen2.5-VL, ...)."""
    served = facts.model_type in _MEDIA_TYPES or any(a in _MEDIA_ARCHITECTURES for a in facts.architectures)
    return not served and isinstance(facts.config.get("vision_config"), dict)


def _vision_language_message(facts: Facts) -> str:
    what = ", ".join(facts.architectures) or facts.model_type
    return (
        f"{facts.root} holds a vision-language model ({what}, model_type {facts.model_type}), which this server "
        "does not serve: read as a text model it would answer other vectors and scores than the model's. Its "
        "reference code (such as the Qwen3-VL-Embedding and -Reranker repositories') or vLLM's pooling runner "
        "serves it. The image-text families served here are CLIP, SigLIP, SigLIP 2, CLAP, ColPali and ColQwen2"
    )


def _sequence_classification(facts: Facts) -> bool:
    return any(a.endswith("ForSequenceClassification") for a in facts.architectures)


def _no_pooling(facts: Facts) -> bool:
    return "Pooling" not in facts.modules


def _seq2seq_generator(facts: Facts) -> bool:
    """An encoder-decoder that generates text (T5ForConditionalGeneration, Whisper's)."""
    generates = any(a.endswith("ForConditionalGeneration") for a in facts.architectures)
    return generates and facts.config.get("is_encoder_decoder") is True


def _seq2seq_message(facts: Facts) -> str:
    return (
        f"{facts.root} holds a sequence-to-sequence model ({', '.join(facts.architectures)}) with no "
        "sentence-transformers pooling: it generates text, and its files do not say its encoder embeds it. "
        "Encoder embedders of this kind (sentence-t5, GTR) ship their sentence-transformers modules; set "
        "`kind: dense` to mean-pool its encoder anyway."
    )


def _masked_lm_only(facts: Facts) -> bool:
    return bool(facts.architectures) and all(a.endswith("ForMaskedLM") for a in facts.architectures)


def _custom_modules(facts: Facts) -> list[str]:
    """modules.json modules of code outside the libraries, other than the Transformer."""
    named = facts.remote_classes()
    return [t for t in facts.module_types if t in named and not t.endswith(".Transformer")]


def _untrusted(facts: Facts) -> str | None:
    return untrusted_code(facts.root, facts.remote_classes())


def _offline(facts: Facts) -> str | None:
    return offline_code((facts.root, facts.transformer_dir), facts.remote_classes())


def _port_note(facts: Facts) -> str:
    unused = " (the checkpoint's hub code is not run)" if facts.remote_classes() else ""
    return f"transformers' native {port_name(facts.model_type)} port{unused}"


def _jina_hf_adapters(facts: Facts) -> bool:
    return facts.model_type == "jina_embeddings_v3" and bool(unapplied_adapters(facts.transformer_dir))


def _jina_hf_message(facts: Facts) -> str:
    return (
        f"{facts.root} is a jina-embeddings-v3 conversion (model_type jina_embeddings_v3) with task adapters "
        f"({'; '.join(unapplied_adapters(facts.transformer_dir))}) that transformers' jina_embeddings_v3 port does "
        "not apply: its vectors would be the base model's, no task's. Serve the published layout "
        "(jinaai/jina-embeddings-v3, XLMRobertaLoRA), whose adapters this server applies per request, or a "
        "directory without the adapters to serve the base weights"
    )


def _jina_lora(facts: Facts) -> bool:
    return is_jina_lora(facts.config) and jina_port() is not None


def _jina_kind_message(facts: Facts) -> str:
    kind = facts.kind.value if facts.kind else "auto"
    return (
        f"{facts.root} holds jina-embeddings-v3 (XLM-R with LoRA task adapters), an embedder: it is served as kind "
        f"dense only, not {kind}"
    )


def _causal_lm_message(facts: Facts) -> str:
    return (
        f"{facts.root} holds a causal language model ({', '.join(facts.architectures)}) with no sentence-transformers "
        "pooling: its files do not say it embeds text. Set `kind: reranker` for a yes/no LLM reranker "
        "(Qwen3-Reranker, bge-reranker-v2-gemma, mxbai-rerank-v2), or `kind: dense` with `pooling: lasttoken` "
        "for an embedder whose files lack the sentence-transformers modules."
    )


def _masked_lm_message(facts: Facts) -> str:
    return (
        f"{facts.root} holds a bare masked-language model ({', '.join(facts.architectures)}) with no pooling "
        "configured: it may be a SPLADE checkpoint or an encoder that was never trained for embeddings, and the "
        "files do not say which. Set `kind: sparse` for SPLADE, or `kind: dense` to mean-pool its hidden states."
    )


def _llm_reranker(facts: Facts) -> bool:
    return facts.kind == Kind.RERANKER and is_causal_lm(facts.architectures)


def _rerank_keys_message(facts: Facts) -> str:
    kind = facts.kind.value if facts.kind else "auto"
    return (
        f"{', '.join(sorted(facts.rerank_keys))} apply to LLM rerankers (a causal LM with kind: reranker); this "
        f"model is a {kind} model ({', '.join(facts.architectures) or facts.model_type})"
    )


def _sentence_transformers_static(facts: Facts) -> bool:
    """modules.json names sentence-transformers' StaticEmbedding (under any of its releases' paths)."""
    return any(t.startswith("sentence_transformers.") and t.endswith(".StaticEmbedding") for t in facts.module_types)


def _static(facts: Facts) -> bool:
    return facts.model_type == "model2vec" or _sentence_transformers_static(facts)


def _static_kind_message(facts: Facts) -> str:
    kind = facts.kind.value if facts.kind else "auto"
    return (
        f"{facts.root} holds a static embedding model (a table of token vectors, averaged): it is served as kind "
        f"dense only, not {kind}"
    )


def _sparse_static(facts: Facts) -> bool:
    """modules.json (or a Router's route) names sentence-transformers' SparseStaticEmbedding."""
    return any(
        t.startswith("sentence_transformers.") and t.endswith(".SparseStaticEmbedding") for t in facts.module_types
    )


def _sparse_static_kind_message(facts: Facts) -> str:
    kind = facts.kind.value if facts.kind else "auto"
    return (
        f"{facts.root} holds a SparseStaticEmbedding module (a weight per token, such as an IDF table): it is served "
        f"as kind sparse only, not {kind}"
    )


def _media_kind(facts: Facts) -> Kind:
    found = [_MEDIA_ARCHITECTURES[a] for a in facts.architectures if a in _MEDIA_ARCHITECTURES]
    return found[0] if found else _MEDIA_TYPES[facts.model_type]


RULES: tuple[Rule, ...] = (
    Rule(
        "open-clip",
        "layout",
        lambda f: not f.has("config.json", inside=True) and f.has("open_clip_config.json"),
        "an open_clip checkpoint: kind `image_text`, served by `adapters/open_clip.py`",
        kind=Kind.IMAGE_TEXT,
        family="open_clip",
    ),
    Rule(
        "static-not-dense",
        "layout",
        lambda f: _static(f) and f.kind not in (None, Kind.DENSE),
        "refused: a static embedding model with a kind other than `dense`",
        refusal=_static_kind_message,
    ),
    Rule(
        "model2vec",
        "layout",
        lambda f: f.model_type == "model2vec",
        "a model2vec static model (config.json's `model_type: model2vec`): kind `dense`, computed as model2vec's "
        "`StaticModel.encode` on numpy, no engine (`adapters/static.py`)",
        kind=Kind.DENSE,
        family="static",
    ),
    Rule(
        "static-embedding",
        "layout",
        _sentence_transformers_static,
        "sentence-transformers' StaticEmbedding module: kind `dense`, computed as `SentenceTransformer.encode` on "
        "numpy, no engine (`adapters/static.py`)",
        kind=Kind.DENSE,
        family="static",
    ),
    Rule(
        "sparse-static-not-sparse",
        "layout",
        lambda f: _sparse_static(f) and f.kind not in (None, Kind.SPARSE),
        "refused: a SparseStaticEmbedding module with a kind other than `sparse`",
        refusal=_sparse_static_kind_message,
    ),
    Rule(
        "sparse-static",
        "layout",
        _sparse_static,
        "sentence-transformers' SparseStaticEmbedding module (the query side of an inference-free sparse model): "
        "kind `sparse`, each token's weight from its table on numpy, no engine (`adapters/sparse_static.py`)",
        kind=Kind.SPARSE,
        family="sparse_static",
    ),
    Rule(
        "no-config",
        "layout",
        lambda f: not f.config and f.kind != Kind.FAKE,
        "refused: not a transformers model directory",
        refusal=lambda f: f"no config.json in {f.transformer_dir}: not a transformers model directory",
    ),
    Rule(
        "vision-language",
        "layout",
        _vision_language,
        "refused: a vision-language model (a `vision_config`) of no family served here, whatever its `kind:`",
        refusal=_vision_language_message,
    ),
    Rule(
        "jina-hf-adapters",
        "code",
        _jina_hf_adapters,
        "refused: a jina_embeddings_v3 conversion carrying task adapters its port does not apply",
        refusal=_jina_hf_message,
    ),
    Rule(
        "native-port",
        "code",
        lambda f: native_port(f.model_type, f.architectures) is not None,
        "transformers' own port runs it, without `trust_remote_code` (nomic_bert, jina_embeddings_v3, "
        "gte-multilingual's `new` layout)",
        remote=False,
        port=True,
        note=_port_note,
    ),
    Rule(
        "jina-lora-port",
        "code",
        _jina_lora,
        "transformers' jina_embeddings_v3 port runs jina-embeddings-v3 as published (XLMRobertaLoRA), without "
        "`trust_remote_code`, its LoRA task adapters applied per request",
        remote=False,
        port=True,
        note=lambda f: (
            "transformers' native jina_embeddings_v3 port with the checkpoint's LoRA task adapters "
            "(the checkpoint's hub code is not run)"
        ),
    ),
    Rule(
        "custom-module",
        "code",
        lambda f: bool(_custom_modules(f)),
        "refused: a modules.json module of the checkpoint's own other than the Transformer",
        refusal=lambda f: (
            f"modules.json names {', '.join(_custom_modules(f))}: this server runs sentence-transformers' own "
            "Pooling, Dense and Normalize modules, not a checkpoint's own"
        ),
    ),
    Rule(
        "remote-code-untrusted",
        "code",
        lambda f: not f.trusted and _untrusted(f) is not None,
        "refused unless `trust_remote_code: true`: `auto_map` or a modules.json module names code outside the "
        "libraries",
        refusal=lambda f: _untrusted(f) or "",
    ),
    Rule(
        "remote-code-offline",
        "code",
        lambda f: _offline(f) is not None,
        "refused: trusted code that is neither here nor in the local hub cache while HF_HUB_OFFLINE is set",
        refusal=lambda f: _offline(f) or "",
    ),
    Rule(
        "remote-code",
        "code",
        lambda f: bool(f.remote_classes()),
        "the checkpoint's own code runs (`trust_remote_code: true`)",
        remote=True,
        note=lambda f: f"the checkpoint's own code ({', '.join(f.remote_classes()[:3])}), trust_remote_code: true",
    ),
    Rule(
        "bge-m3",
        "kind",
        lambda f: f.has("colbert_linear.pt") and f.has("sparse_linear.pt"),
        "kind `multi_output` (FlagEmbedding's `colbert_linear.pt` and `sparse_linear.pt`)",
        kind=Kind.MULTI_OUTPUT,
    ),
    Rule(
        "colbert-ai",
        "kind",
        lambda f: f.has("artifact.metadata"),
        "kind `multivector` (colbert-ai's `artifact.metadata`)",
        kind=Kind.MULTIVECTOR,
    ),
    Rule(
        "pylate",
        "kind",
        lambda f: is_pylate(f.root, f.modules),
        "kind `multivector` (Transformer + Dense, no Pooling, ColBERT lengths or prefixes)",
        kind=Kind.MULTIVECTOR,
    ),
    Rule(
        "splade",
        "kind",
        lambda f: "SpladePooling" in f.modules or "MLMTransformer" in f.modules,
        "kind `sparse` (sentence-transformers' SparseEncoder modules)",
        kind=Kind.SPARSE,
    ),
    Rule(
        "cross-encoder",
        "kind",
        lambda f: _sequence_classification(f) and label_count(f.config) == 1,
        "kind `reranker` (`*ForSequenceClassification` with one label)",
        kind=Kind.RERANKER,
    ),
    Rule(
        "classifier",
        "kind",
        _sequence_classification,
        "kind `classifier` (`*ForSequenceClassification` with several labels)",
        kind=Kind.CLASSIFIER,
    ),
    Rule(
        "llm-reranker-template",
        "kind",
        lambda f: is_causal_lm(f.architectures) and reranker_chat_template(f.root),
        "kind `reranker` (a causal LM whose chat template renders the `query` and `document` roles)",
        kind=Kind.RERANKER,
    ),
    Rule(
        "media",
        "kind",
        lambda f: f.model_type in _MEDIA_TYPES or any(a in _MEDIA_ARCHITECTURES for a in f.architectures),
        "the media kind of its architecture: CLIP, SigLIP, SigLIP 2 `image_text`; CLAP `audio_text`; "
        "ColPali, ColQwen2, ColModernVBert `page_text`",
        kind=_media_kind,
    ),
    Rule(
        "causal-lm-without-pooling",
        "kind",
        lambda f: is_causal_lm(f.architectures) and _no_pooling(f),
        "refused: a causal LM is not an embedder unless its sentence-transformers modules or `kind:` say so",
        refusal=_causal_lm_message,
    ),
    Rule(
        "seq2seq-without-pooling",
        "kind",
        lambda f: _seq2seq_generator(f) and _no_pooling(f),
        "refused: a text-generating encoder-decoder (T5) is not an embedder unless its sentence-transformers "
        "modules or `kind:` say so",
        refusal=_seq2seq_message,
    ),
    Rule(
        "bare-masked-lm",
        "kind",
        lambda f: _masked_lm_only(f) and _no_pooling(f),
        "refused: a bare `*ForMaskedLM` may be SPLADE or a plain encoder; `kind:` says which",
        refusal=_masked_lm_message,
    ),
    Rule("dense", "kind", lambda f: True, "kind `dense`", kind=Kind.DENSE),
    Rule(
        "rerank-keys-elsewhere",
        "family",
        lambda f: bool(f.rerank_keys) and not _llm_reranker(f),
        "refused: `template`, `true_token`, `false_token` or `instruction` on a model that is not an LLM reranker",
        refusal=_rerank_keys_message,
    ),
    Rule(
        "jina-lora-not-dense",
        "family",
        lambda f: _jina_lora(f) and f.kind != Kind.DENSE,
        "refused: jina-embeddings-v3 with a kind other than `dense`",
        refusal=_jina_kind_message,
    ),
    Rule(
        "jina-lora",
        "family",
        _jina_lora,
        "jina-embeddings-v3's task adapters, chosen per request (`adapters/jina_lora.py`)",
        family="jina_lora",
    ),
    Rule(
        "siglip2-naflex",
        "family",
        lambda f: f.model_type == "siglip2",
        "SigLIP 2 NaFlex, served by `adapters/naflex.py`",
        family="naflex",
    ),
    Rule(
        "llm-reranker",
        "family",
        _llm_reranker,
        "a causal LM with kind `reranker`: scored by its yes/no logits (`adapters/llm_reranker.py`)",
        family="llm_reranker",
    ),
)


def first(facts: Facts, stage: Stage, rules: Sequence[Rule] = RULES) -> Rule | None:
    """The first rule of `stage` that matches; a refusal raises its message."""
    for rule in rules:
        if rule.stage == stage and rule.when(facts):
            if rule.refusal is not None:
                raise ModelUnavailable(rule.refusal(facts))
            return rule
    return None


def origin(facts: Facts) -> Origin:
    """Whose code runs the model (the code stage)."""
    rule = first(facts, "code")
    if rule is None:
        return Origin()
    return Origin(remote=bool(rule.remote), note=rule.note(facts) if rule.note else None, port=rule.port)


def kind(facts: Facts) -> Kind:
    """The kind these files say (the kind stage; its last rule matches any directory)."""
    rule = first(facts, "kind")
    assert rule is not None, "This is a bug: the kind rules end with one that matches any directory"
    return rule.kind_of(facts)


def family(facts: Facts, decided: Kind) -> str | None:
    """The adapter family of a layout served unlike its kind's default (the family stage)."""
    rule = first(replace(facts, kind=decided), "family")
    return rule.family if rule else None
