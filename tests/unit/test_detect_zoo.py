"""Kinds of the text zoo are detected from each directory's own files."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_registry.config import ModelSpec
from model_registry.detect import detect
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
