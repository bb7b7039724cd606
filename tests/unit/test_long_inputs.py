"""The windowing and pooling arithmetic of `long_inputs: "chunk"`."""

from __future__ import annotations

import time

import numpy as np
import pytest

from model_registry.errors import InvalidInput
from model_registry.tasks.long_inputs import Plan, merge, pool, sentences, token_ranges, windows
from model_registry.types import Embedding, Results, Score, Token, TokenIds


def test_windows_overlap_by_an_eighth_and_cover_every_token() -> None:
    ids = [101, *range(1000, 1040), 102]
    cut = windows(ids, 18, leading=1, trailing=1)
    room, step = 16, 14
    assert [w.ids[0] for w in cut] == [101] * len(cut)
    assert [w.ids[-1] for w in cut] == [102] * len(cut)
    assert [list(w.ids[1:-1]) for w in cut] == [list(range(1000 + s, min(1040, 1000 + s + room))) for s in (0, 14, 28)]
    assert [w.weight for w in cut] == [16, 16, 12]
    assert all(len(w.ids) <= 18 for w in cut)
    assert step == room - room // 8


def test_windows_without_special_tokens() -> None:
    cut = windows(list(range(20)), 10, leading=0, trailing=0)
    assert [w.ids[0] for w in cut] == [0, 9, 18]
    assert cut[-1].ids == (18, 19)


def test_a_length_with_no_room_for_text_is_refused() -> None:
    with pytest.raises(InvalidInput, match="no room"):
        windows(list(range(20)), 3, leading=1, trailing=1)


def test_pool_is_the_token_weighted_mean_renormalised() -> None:
    a, b = np.array([1.0, 0.0], dtype=np.float32), np.array([0.0, 1.0], dtype=np.float32)
    np.testing.assert_allclose(pool([a, b], [3, 1], normalize=False), [0.75, 0.25])
    np.testing.assert_allclose(pool([a, b], [3, 1], normalize=True), np.array([3.0, 1.0]) / np.sqrt(10), rtol=1e-6)


def test_merge_pools_each_input_and_counts_every_window_token() -> None:
    vectors = [np.array([1.0, 0.0], np.float32), np.array([0.0, 2.0], np.float32), np.array([5.0, 5.0], np.float32)]
    results = Results(tuple(Embedding(dense=v) for v in vectors), 30, (10, 12, 8))
    plan = Plan((TokenIds((1,)), TokenIds((2,)), TokenIds((3,))), ((0, 1), (2,)), (4, 4, 1))
    merged = merge(results, plan, normalize=False)
    assert merged.tokens == 30
    assert merged.item_tokens == (22, 8)
    first, second = merged.items
    assert isinstance(first, Embedding)
    assert isinstance(second, Embedding)
    assert first.dense is not None
    np.testing.assert_allclose(first.dense, np.array([0.5, 1.0]))
    assert second is results.items[2]


def test_merge_refuses_a_window_without_a_vector() -> None:
    results = Results((Score(1.0), Score(2.0)), 4, (2, 2))
    with pytest.raises(AssertionError, match="This is a bug"):
        merge(results, Plan((TokenIds((1,)), TokenIds((2,))), ((0, 1),), (1, 1)), normalize=True)


def test_sentences_split_on_end_marks_followed_by_space() -> None:
    text = "First one. Second!  Third? last  "
    assert [text[s:e] for s, e in sentences(text)] == ["First one.", "Second!", "Third?", "last"]
    number = "3.5 is a number. Yes"
    assert [number[s:e] for s, e in sentences(number)] == ["3.5 is a number.", "Yes"]


def test_sentences_of_long_runs_take_one_pass() -> None:
    # A backtracking rule took 11 s on 40,000 spaces, growing with their square: these take minutes
    # that way, and milliseconds in one pass.
    started = time.perf_counter()
    spaces = "a" + " " * 200_000 + "b"
    assert sentences(spaces) == [(0, 200_002)]
    marks = "a" + "!" * 200_000 + "b c. d"
    assert sentences(marks) == [(0, 200_005), (200_006, 200_007)]
    assert sentences(" \n ") == []
    assert time.perf_counter() - started < 5


def test_token_ranges_take_the_tokens_that_overlap_each_span() -> None:
    tokens = [Token(101, "[CLS]", True, None, None), Token(1, "ab", False, 2, 4), Token(2, "cd", False, 5, 7)]
    tokens.append(Token(102, "[SEP]", True, None, None))
    assert token_ranges(tokens, [(0, 2), (1, 5), (3, 5)], 5, shift=2, index=0) == ((1, 2), (1, 3), (2, 3))
    with pytest.raises(InvalidInput, match="not within"):
        token_ranges(tokens, [(4, 9)], 5, shift=2, index=0)
    with pytest.raises(InvalidInput, match="holds no token"):
        token_ranges(tokens, [(2, 3)], 5, shift=2, index=0)
