"""ColPali and ColQwen2 queries are cut to what the model takes, keeping the processor's suffix."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pytest

from model_registry.adapters import create_adapter
from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.config import ModelSpec
from model_registry.types import EmbedItem, Output, Text
from tests.builders.media import tiny_colmodernvbert, tiny_colpali, tiny_colqwen2

Builder = Callable[[Path], Path]


def loaded(path: Path, **spec: object) -> Adapter:
    adapter = create_adapter(ModelSpec(name="m", source=str(path), **spec))  # type: ignore[arg-type]
    adapter.load(LoadOptions(device="cpu", dtype="float32", max_batch_tokens=1024))
    return adapter


@pytest.fixture(
    scope="module",
    params=[tiny_colpali, tiny_colqwen2, functools.partial(tiny_colqwen2, backbone="qwen2_5_vl"), tiny_colmodernvbert],
    ids=["colpali", "colqwen2", "colqwen2.5", "colmodernvbert"],
)
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    build: Builder = request.param
    return build(tmp_path_factory.mktemp("pages") / "model")


def query(text: str) -> EmbedItem:
    return EmbedItem(Text(text), outputs=frozenset({Output.MULTIVECTOR}))


def test_a_long_query_is_cut_to_max_length_and_keeps_its_suffix(model_dir: Path) -> None:
    adapter = loaded(model_dir, max_length=40)
    processor = adapter.processor  # type: ignore[attr-defined]
    short, long = adapter.prepare([query("cats"), query("a very long question about cats " * 50)])
    assert short.tokens < 40
    assert long.tokens == long.cost
    assert 35 <= long.tokens <= 40
    ids = long.data["input_ids"].tolist()
    full = processor.process_queries(["a very long question about cats " * 50])["input_ids"][0].tolist()
    # the augmentation tokens (ten), then a newline where the processor ends queries with one
    tail = {
        processor.tokenizer.convert_tokens_to_ids(processor.query_augmentation_token),
        *processor.tokenizer("\n")["input_ids"],
    }
    kept = next(i for i in range(len(full)) if full[-1 - i] not in tail)
    assert kept in (10, 11)
    assert ids[-kept:] == full[-kept:]
    assert ids[: len(ids) - kept] == full[: len(ids) - kept]  # the text is cut at its end, nothing else


def test_without_a_configured_limit_the_text_models_positions_bound_the_query(model_dir: Path) -> None:
    adapter = loaded(model_dir)
    positions = adapter.query_max_length  # type: ignore[attr-defined]
    assert positions in (8192, 32768, 512)  # the tiny PaliGemma's, Qwen2-VL's and ModernBERT's positions
    (long,) = adapter.prepare([query("x" * (positions + 500))])
    assert long.tokens == positions
