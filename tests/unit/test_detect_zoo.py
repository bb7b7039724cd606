"""Kinds of the text zoo are detected from each directory's own files."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_registry.config import ModelSpec
from model_registry.detect import detect
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


def test_plain_masked_lm_is_sparse_only_when_configured(tmp_path: Path) -> None:
    directory = tiny_masked_lm(tmp_path / "mlm")
    assert kind_of(directory) == Kind.DENSE
    assert kind_of(directory, kind="sparse") == Kind.SPARSE
