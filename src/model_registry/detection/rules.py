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

The rules here are the ones no family owns (code, refusals of what no family serves, the media
kinds read from every family's declared types); each family declares its own
(`model_registry.families`), and `all_rules` merges them by stage and `order`.

`docs/text-zoo.md` lists every rule by name; `tests/unit/test_detect_rules.py` has a directory
that each rule matches and one it must not.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace

from model_registry import families
from model_registry.errors import ModelUnavailable
from model_registry.families import STAGES, Facts, Rule, Stage
from model_registry.families.ports import native_port, port_name
from model_registry.types import Kind
from model_registry.zoo.files import is_causal_lm, offline_code, untrusted_code

__all__ = ["STAGES", "Facts", "Origin", "Rule", "Stage", "all_rules", "family", "first", "kind", "origin"]


@dataclass(frozen=True)
class Origin:
    """Whose code runs the model, and what `/models` says about it (None: the library's own)."""

    remote: bool = False
    note: str | None = None
    port: bool = False


def _media_kinds() -> dict[str, Kind]:
    """`model_type`s and architectures -> the media kind of the family that declares them."""
    return _media_kinds_of(families.declared())


@functools.cache
def _media_kinds_of(declared: tuple[families.Family, ...]) -> dict[str, Kind]:
    found: dict[str, Kind] = {}
    for family in declared:
        if family.kind is not None:
            found |= dict.fromkeys(family.model_types | family.architectures, family.kind)
    return found


def _media(facts: Facts) -> bool:
    kinds = _media_kinds()
    return facts.model_type in kinds or any(a in kinds for a in facts.architectures)


def _vision_language(facts: Facts) -> bool:
    """A model with a vision tower that no media family here serves (Qwen3-VL, Qwen2.5-VL, ...)."""
    return not _media(facts) and isinstance(facts.config.get("vision_config"), dict)


def _vision_language_message(facts: Facts) -> str:
    what = ", ".join(facts.architectures) or facts.model_type
    return (
        f"{facts.root} holds a vision-language model ({what}, model_type {facts.model_type}), which this server "
        "does not serve: read as a text model it would answer other vectors and scores than the model's. Its "
        "reference code (such as the Qwen3-VL-Embedding and -Reranker repositories') or vLLM's pooling runner "
        "serves it. The image-text families served here are CLIP, SigLIP, SigLIP 2, CLAP, ColPali, ColQwen2, "
        "Qwen3-VL-Embedding, GME (Qwen2-VL) and jina-embeddings-v4 (Qwen2.5-VL)"
    )


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


def _media_kind(facts: Facts) -> Kind:
    kinds = _media_kinds()
    found = [kinds[a] for a in facts.architectures if a in kinds]
    return found[0] if found else kinds[facts.model_type]


#: The rules no family owns (each family declares its own: `model_registry.families`).
GENERAL: tuple[Rule, ...] = (
    Rule(
        "no-config",
        "layout",
        lambda f: not f.config and f.kind != Kind.FAKE,
        "refused: not a transformers model directory",
        refusal=lambda f: f"no config.json in {f.transformer_dir}: not a transformers model directory",
        order=80,
    ),
    Rule(
        "vision-language",
        "layout",
        _vision_language,
        "refused: a vision-language model (a `vision_config`) of no family served here, whatever its `kind:`",
        refusal=_vision_language_message,
        order=90,
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
        order=20,
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
        order=50,
    ),
    Rule(
        "remote-code-untrusted",
        "code",
        lambda f: not f.trusted and _untrusted(f) is not None,
        "refused unless `trust_remote_code: true`: `auto_map` or a modules.json module names code outside the "
        "libraries",
        refusal=lambda f: _untrusted(f) or "",
        order=60,
    ),
    Rule(
        "remote-code-offline",
        "code",
        lambda f: _offline(f) is not None,
        "refused: trusted code that is neither here nor in the local hub cache while HF_HUB_OFFLINE is set",
        refusal=lambda f: _offline(f) or "",
        order=70,
    ),
    Rule(
        "remote-code",
        "code",
        lambda f: bool(f.remote_classes()),
        "the checkpoint's own code runs (`trust_remote_code: true`)",
        remote=True,
        note=lambda f: f"the checkpoint's own code ({', '.join(f.remote_classes()[:3])}), trust_remote_code: true",
        order=80,
    ),
    Rule(
        "media",
        "kind",
        _media,
        "the media kind of its architecture: CLIP, SigLIP, SigLIP 2 `image_text`; CLAP `audio_text`; "
        "ColPali, ColQwen2, ColModernVBert `page_text`; Qwen3-VL `dense` (Qwen3-VL-Embedding), Qwen2-VL `dense` (GME), "
        "JinaEmbeddingsV4Model `dense` (jina-embeddings-v4)",
        kind=_media_kind,
        order=60,
    ),
    Rule(
        "causal-lm-without-pooling",
        "kind",
        lambda f: is_causal_lm(f.architectures) and _no_pooling(f),
        "refused: a causal LM is not an embedder unless its sentence-transformers modules or `kind:` say so",
        refusal=_causal_lm_message,
        order=80,
    ),
    Rule(
        "seq2seq-without-pooling",
        "kind",
        lambda f: _seq2seq_generator(f) and _no_pooling(f),
        "refused: a text-generating encoder-decoder (T5) is not an embedder unless its sentence-transformers "
        "modules or `kind:` say so",
        refusal=_seq2seq_message,
        order=81,
    ),
    Rule(
        "bare-masked-lm",
        "kind",
        lambda f: _masked_lm_only(f) and _no_pooling(f),
        "refused: a bare `*ForMaskedLM` may be SPLADE or a plain encoder; `kind:` says which",
        refusal=_masked_lm_message,
        order=82,
    ),
)


@functools.cache
def _ordered(declared: tuple[families.Family, ...]) -> tuple[Rule, ...]:
    merged = [*GENERAL, *(rule for family in declared for rule in family.rules)]
    return tuple(sorted(merged, key=lambda rule: (STAGES.index(rule.stage), rule.order)))


def all_rules() -> tuple[Rule, ...]:
    """Every rule, the general ones and every family's, in the order they are tried."""
    return _ordered(families.declared())


def first(facts: Facts, stage: Stage, rules: Sequence[Rule] | None = None) -> Rule | None:
    """The first rule of `stage` that matches; a refusal raises its message."""
    for rule in all_rules() if rules is None else rules:
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
