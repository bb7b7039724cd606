"""The shared text tokenizer against the Hugging Face wrapper's own calls, alone and from threads."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from model_registry.adapters.text import TextTokenizer
from model_registry.errors import ConfigError, InputTooLong, InvalidInput
from tests.builders.text import tiny_bert

LIMIT = 16
# Short and over-long texts, empty, accents, a text spelling a special token, odd spacing.
TEXTS = ["a cat", "", "the cat sat on the mat " * 20, "Ünïcödé café 日本", "[CLS] a [SEP] b", "  spaced  "]
QUERIES = ["where is the cat", "a query far too long to leave the document any room " * 3] * 3


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_bert(tmp_path_factory.mktemp("bert"))


def ours(directory: Path) -> TextTokenizer:
    tokenizer = TextTokenizer(directory, max_length=LIMIT, config=None)
    tokenizer.enable_pairs()
    return tokenizer


def wrapper(directory: Path) -> Any:
    """A wrapper of its own, which no call of the tokenizer under test can reconfigure."""
    return AutoTokenizer.from_pretrained(str(directory))


def test_every_encoding_matches_the_wrappers_call(directory: Path) -> None:
    tokenizer, hf = ours(directory), wrapper(directory)
    cut = hf(TEXTS, truncation=True, max_length=LIMIT, return_attention_mask=False)["input_ids"]
    assert max(len(ids) for ids in cut) == LIMIT
    assert tokenizer.encode(TEXTS, [True] * len(TEXTS)) == cut
    whole = hf(TEXTS, add_special_tokens=False, return_offsets_mapping=True)
    assert tokenizer.ids(TEXTS, special=False, cut=None) == whole["input_ids"]
    spans = hf(TEXTS, truncation=True, max_length=LIMIT, return_offsets_mapping=True)["offset_mapping"]
    tokens = tokenizer.tokens(TEXTS, add_special_tokens=True)
    assert [[t.id for t in row] for row in tokens] == cut
    assert [[(t.start, t.stop) for t in row if not t.special] for row in tokens] == [
        [tuple(s) for i, s in zip(ids, row, strict=True) if i not in hf.all_special_ids]
        for ids, row in zip(cut, spans, strict=True)
    ]
    assert tokenizer.first_tokens(TEXTS, 3) == [
        text if len(o) <= 3 else text[: o[2][1]] for text, o in zip(TEXTS, whole["offset_mapping"], strict=True)
    ]
    for strategy in ("only_second", "longest_first"):
        expected = hf(QUERIES[:1] * 3, TEXTS[:3], truncation=strategy, max_length=LIMIT, return_token_type_ids=True)
        got = tokenizer.run(QUERIES[:1] * 3, TEXTS[:3], cut=strategy)
        assert [e.ids for e in got] == expected["input_ids"]
        assert [e.type_ids for e in got] == expected["token_type_ids"]
    assert tokenizer.prompt_length("query: ") == len(hf("query: ")["input_ids"]) - 1


def test_an_over_long_text_with_truncation_off_names_its_index_and_length(directory: Path) -> None:
    tokenizer, hf = ours(directory), wrapper(directory)
    full = len(hf(TEXTS[2])["input_ids"])
    with pytest.raises(InputTooLong, match=f"input 7 has {full} tokens, more than the model's limit of {LIMIT}"):
        tokenizer.encode(TEXTS[:3], [True, True, False], offset=5)


def test_threads_with_different_truncation_each_get_their_own(directory: Path) -> None:
    """The wrapper keeps truncation on its one Rust tokenizer and resets it at every call that asks
    for another: called this way from several threads, texts that should be cut came back whole
    in about one call in five. The expected results come from a separate wrapper, one call at a time."""
    tokenizer, hf = ours(directory), wrapper(directory)
    long = [f"{i} " + "the cat sat on the mat and looked at the dog " * 12 for i in range(48)]
    cut = hf(long, truncation=True, max_length=LIMIT, return_attention_mask=False)["input_ids"]
    whole = hf(long, add_special_tokens=False, return_offsets_mapping=True)
    pairs = hf(QUERIES[:1] * 48, long, truncation="only_second", max_length=LIMIT)["input_ids"]
    first = [text[: o[19][1]] for text, o in zip(long, whole["offset_mapping"], strict=True)]
    calls: list[tuple[Callable[[], object], object]] = [
        (lambda: tokenizer.encode(long, [True] * len(long)), cut),
        (lambda: [[t.id for t in row] for row in tokenizer.tokens(long, add_special_tokens=True)], cut),
        (lambda: tokenizer.ids(long, special=False, cut=None), whole["input_ids"]),
        (lambda: tokenizer.first_tokens(long, 20), first),
        (lambda: [e.ids for e in tokenizer.run(QUERIES[:1] * 48, long, cut="only_second")], pairs),
    ]
    wrong: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(len(calls))

    def hammer(index: int) -> None:
        call, expected = calls[index]
        start.wait()
        for _ in range(60):
            try:
                if call() != expected:
                    wrong.append(index)
            except Exception as error:  # "Already borrowed" from a tokenizer reconfigured mid-encode
                errors.append(error)

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]
    assert not wrong, f"wrong results from calls {sorted(set(wrong))}, {len(wrong)} times"


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_request_limit_cuts_as_the_wrapper_cuts_at_that_length(directory: Path, side: str) -> None:
    tokenizer, hf = ours(directory), wrapper(directory)
    hf.truncation_side = side
    for cap in (3, 5, 9, LIMIT, LIMIT + 40):
        expected = hf(TEXTS, truncation=True, max_length=min(cap, LIMIT), return_attention_mask=False)["input_ids"]
        got = tokenizer.encode(TEXTS, [True] * len(TEXTS), left=[side == "left"] * len(TEXTS), caps=[cap] * len(TEXTS))
        assert got == expected, cap
    assert tokenizer.check_ids([5, 6, 7, 8, 9], True, 0, 3) == [5, 6, 7]


def test_a_request_limit_refuses_a_longer_text_without_truncation_and_needs_room_for_text(directory: Path) -> None:
    tokenizer = ours(directory)
    hf = wrapper(directory)
    assert tokenizer.encode(["a cat"], [False], caps=[4]) == hf(["a cat"])["input_ids"]
    longer = len(hf("a cat sat")["input_ids"])
    with pytest.raises(InputTooLong, match=f"input 0 has {longer} tokens, more than the request's token limit of 4"):
        tokenizer.encode(["a cat sat"], [False], caps=[4])
    with pytest.raises(InvalidInput, match="no room for text after the model's 2 special tokens"):
        tokenizer.cap(2)
    with pytest.raises(InputTooLong, match="input 1 has 5 tokens, more than the request's token limit of 3"):
        tokenizer.check_ids([5, 6, 7, 8, 9], False, 1, 3)


@pytest.mark.parametrize(
    ("family", "table", "usable"),
    [("bert", 64, 64), ("xlm-roberta", 66, 64), ("roberta", 66, 64)],
)
def test_max_length_past_the_position_table_is_refused_at_load(
    directory: Path, family: str, table: int, usable: int
) -> None:
    import torch
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.for_model(
        family, vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=table, pad_token_id=1,
    )  # fmt: skip
    model = AutoModel.from_config(config).eval()
    ids = torch.full((1, usable), 5)
    with torch.no_grad():
        model(input_ids=ids)  # the longest input the table takes
        with pytest.raises((IndexError, RuntimeError)):
            model(input_ids=torch.full((1, usable + 1), 5))
    assert TextTokenizer(directory, max_length=usable, config=config).max_length == usable
    with pytest.raises(ConfigError, match=f"max_length {usable + 1} is more than the {usable} positions"):
        TextTokenizer(directory, max_length=usable + 1, config=config)
    assert TextTokenizer(directory, max_length=None, config=config).max_length <= usable
