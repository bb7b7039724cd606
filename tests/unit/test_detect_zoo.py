"""Kinds of the text zoo are detected from each directory's own files."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_registry.config import ModelSpec
from model_registry.detection.layout import detect
from model_registry.errors import ModelUnavailable
from model_registry.types import Kind
from tests.builders.text import tiny_bert
from tests.builders.zoo import tiny_bge_m3, tiny_colbert, tiny_cross_encoder, tiny_masked_lm, tiny_pylate


def kind_of(path: Path, **spec: object) -> Kind:
    return detect(path, ModelSpec(name="m", source=str(path), **spec)).kind  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("build", "kind"),
    [
        (lambda p: tiny_cross_encoder(p), Kind.RERANKER),
        (lambda p: tiny_cross_encoder(p, labels=3), Kind.CLASSIFIER),
        (lambda p: tiny_masked_lm(p, sparse_layout=True), Kind.SPARSE),
        (lambda p: tiny_colbert(p), Kind.MULTIVECTOR),
        (lambda p: tiny_pylate(p), Kind.MULTIVECTOR),
        (lambda p: tiny_bge_m3(p), Kind.MULTI_OUTPUT),
        (lambda p: tiny_bert(p), Kind.DENSE),
    ],
)
def test_kind_is_detected(tmp_path: Path, build: object, kind: Kind) -> None:
    directory = build(tmp_path / "model")  # type: ignore[operator]
    assert kind_of(directory) == kind


def test_a_bare_masked_lm_is_refused_until_its_kind_is_configured(tmp_path: Path) -> None:
    """A bare `*ForMaskedLM` directory is never served as what it may not be (e.g. mean-pooled dense)."""
    directory = tiny_masked_lm(tmp_path / "mlm")
    with pytest.raises(ModelUnavailable, match=r"bare masked-language model \(BertForMaskedLM\).*kind: sparse"):
        kind_of(directory)
    assert kind_of(directory, kind="sparse") == Kind.SPARSE
    assert kind_of(directory, kind="dense") == Kind.DENSE


def test_a_masked_lm_with_sentence_transformers_pooling_stays_dense(tmp_path: Path) -> None:
    import json

    directory = tiny_masked_lm(tmp_path / "st")
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (directory / "modules.json").write_text(json.dumps(modules))
    assert kind_of(directory) == Kind.DENSE


def test_a_causal_lm_without_pooling_is_refused_until_its_kind_is_configured(tmp_path: Path) -> None:
    """A yes/no LLM reranker in its original format is never served as a last-token embedder."""
    from tests.builders.llm_rerankers import tiny_qwen3_reranker

    directory = tiny_qwen3_reranker(tmp_path / "qwen3")
    with pytest.raises(ModelUnavailable, match=r"causal language model \(Qwen3ForCausalLM\).*kind: reranker"):
        kind_of(directory)
    layout = detect(directory, ModelSpec(name="m", source=str(directory), kind=Kind.RERANKER))
    assert layout.kind == Kind.RERANKER
    assert layout.rerank_prompt is not None
    assert layout.rerank_prompt.origin == "qwen3-reranker"
    assert kind_of(directory, kind="dense") == Kind.DENSE


def test_qwen3_embedding_stays_dense_as_its_modules_say(tmp_path: Path) -> None:
    from tests.builders.llm_rerankers import tiny_qwen3_embedding

    directory = tiny_qwen3_embedding(tmp_path / "qwen3-embedding")
    layout = detect(directory, ModelSpec(name="m", source=str(directory)))
    assert (layout.kind, layout.pooling, layout.rerank_prompt) == (Kind.DENSE, "lasttoken", None)


def test_a_chat_template_with_pair_roles_makes_a_causal_lm_a_reranker(tmp_path: Path) -> None:
    from tests.builders.llm_rerankers import tiny_qwen3_reranker, with_chat_template

    directory = with_chat_template(tiny_qwen3_reranker(tmp_path / "chat"))
    layout = detect(directory, ModelSpec(name="m", source=str(directory)))
    assert layout.kind == Kind.RERANKER
    assert layout.rerank_prompt is not None
    assert layout.rerank_prompt.template is None


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"template": "Q: {query}"}, "must contain {query} and {document}"),
        ({"template": "{query} {document} {passage}"}, "the field {passage}"),
        ({"template": "{query!r} {document}"}, "the field {query}"),
        ({"kind": "dense", "instruction": "x"}, "instruction apply to LLM rerankers"),
    ],
)
def test_llm_reranker_keys_are_checked_when_the_configuration_is_read(extra: dict[str, str], expected: str) -> None:
    from model_registry.config import registry_config
    from model_registry.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        registry_config({"models": [{"name": "m", "source": "x", **extra}]})
    assert expected in str(caught.value)


def test_llm_reranker_keys_on_another_kind_of_model_are_refused(tmp_path: Path) -> None:
    directory = tiny_cross_encoder(tmp_path / "ce")
    with pytest.raises(ModelUnavailable, match=r"true_token apply to LLM rerankers.*BertForSequenceClassification"):
        kind_of(directory, true_token="yes")


def test_a_causal_lm_of_no_known_layout_asks_for_its_template(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.builders.llm_rerankers import TINY, qwen_tokenizer

    tokenizer = qwen_tokenizer()
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), **TINY)).save_pretrained(tmp_path / "llama")
    tokenizer.save_pretrained(tmp_path / "llama")
    with pytest.raises(ModelUnavailable, match=r"LlamaForCausalLM.*set the model's `template`"):
        kind_of(tmp_path / "llama", kind="reranker")
    assert kind_of(tmp_path / "llama", kind="reranker", template="{query} {document}") == Kind.RERANKER
