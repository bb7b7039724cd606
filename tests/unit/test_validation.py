"""Input checks, called directly: each refusal names its parameter and what would be accepted."""

from __future__ import annotations

import re

import pytest

from model_registry.adapters.fake import FakeAdapter
from model_registry.config import registry_config
from model_registry.errors import InvalidInput, UnsupportedOperation
from model_registry.tasks import validation
from model_registry.types import Capability, Media, Modality, Output, Text, TokenIds

CONFIG = registry_config(
    {"models": [{"name": "m", "source": "fake", "kind": "fake"}], "max_inputs_per_request": 3, "max_input_chars": 10}
)


def adapter(**attributes: object) -> FakeAdapter:
    made = FakeAdapter({})
    for name, value in attributes.items():
        setattr(made, name, value)
    return made


def test_inputs_become_contents_in_order() -> None:
    image = Media(Modality.IMAGE, b"\x89PNG", "x.png")
    assert validation.contents(["a cat", [101, 7], image], CONFIG) == [Text("a cat"), TokenIds((101, 7)), image]


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ("a cat", "input must be a list"),
        ([], "input must not be empty"),
        (["a", "b", "c", "d"], "input has 4 items; at most 3 are accepted per request"),
        (["a", "  "], "input 1 is empty; every input needs some text"),
        (["a", "x" * 11], "input 1 has 11 characters; the limit is 10"),
        ([[1, True]], "input 0 must be a string or a non-empty list of token ids"),
        ([3.5], "input 0 is of an unsupported type float"),
    ],
)
def test_bad_inputs_are_refused_with_the_reason(inputs: object, message: str) -> None:
    with pytest.raises(InvalidInput, match="^" + re.escape(message)) as refused:
        validation.contents(inputs, CONFIG)  # type: ignore[arg-type]
    assert refused.value.param == "input"


def test_a_text_only_task_refuses_token_ids_with_its_own_message() -> None:
    with pytest.raises(InvalidInput, match=r"^tokenize takes texts$"):
        validation.texts([[1, 2]], CONFIG, "tokenize takes texts")  # type: ignore[list-item]


def test_classified_inputs_are_texts_or_pairs_each_text_bounded_as_one() -> None:
    checked = validation.texts_or_pairs(["a cat", ["a dog", "a pet"], ("x", "y")], CONFIG, "texts only")
    assert checked == [("a cat", None), ("a dog", "a pet"), ("x", "y")]


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([], "input must not be empty"),
        (["a", "b", ["c", "d"], "e"], "input has 4 items; at most 3 are accepted per request"),
        ([["a", " "]], "input 0 is empty; every input needs some text"),
        (["a", ["b", "x" * 11]], "input 1 has 11 characters; the limit is 10"),
        ([[1, 2]], "texts only"),
        ([["a", "b", "c"]], "input 0 is a list of 3 texts; a pair is two, [text, text_pair]"),
    ],
)
def test_a_bad_text_or_pair_is_refused_with_the_reason(inputs: object, message: str) -> None:
    with pytest.raises(InvalidInput, match="^" + re.escape(message)) as refused:
        validation.texts_or_pairs(inputs, CONFIG, "texts only")  # type: ignore[arg-type]
    assert refused.value.param == "input"


def test_outputs_the_model_cannot_produce_are_named_with_its_capabilities() -> None:
    validation.require_outputs("m", adapter(), frozenset({Output.DENSE}))
    with pytest.raises(UnsupportedOperation) as refused:
        validation.require_outputs("m", adapter(), frozenset({Output.SPARSE, Output.MULTIVECTOR}))
    assert "cannot produce" in str(refused.value)
    assert "its capabilities are: embed_text" in str(refused.value)
    with pytest.raises(UnsupportedOperation, match="cannot classify; its capabilities are: embed_text"):
        validation.require("m", adapter(), Capability.CLASSIFY, "classify")


def test_the_truncation_side_is_one_the_model_cuts_at() -> None:
    right_only, both = adapter(), adapter(truncation_sides=("right", "left"))
    assert validation.cut_left(both, "m", "left") is True
    assert validation.cut_left(right_only, "m", "right") is False
    assert validation.cut_left(right_only, "m", "left", pairs=True) is True  # pairs are cut by the task
    with pytest.raises(UnsupportedOperation, match="only on the right"):
        validation.cut_left(right_only, "m", "left")
    with pytest.raises(InvalidInput, match="must be left or right, got 'up'"):
        validation.cut_left(both, "m", "up")


def test_a_prompt_is_the_requests_own_a_named_one_or_the_default() -> None:
    prompts = adapter(prompts={"query": "q: ", "passage": "p: "}, default_prompt_name="passage")
    assert validation.prompt_text(prompts, None, "own: ") == "own: "
    assert validation.prompt_text(prompts, "query", None) == "q: "
    assert validation.prompt_text(prompts, None, None) == "p: "
    assert validation.prompt_text(adapter(), None, None) == ""
    with pytest.raises(InvalidInput, match="unknown prompt_name 'doc'; this model's prompts are: passage, query"):
        validation.prompt_text(prompts, "doc", None)


def test_an_instruction_or_a_tokenizer_the_model_lacks_is_refused() -> None:
    validation.check_instruction(adapter(rerank_instructions=True), "m", "judge relevance")
    validation.check_instruction(adapter(), "m", None)
    with pytest.raises(UnsupportedOperation, match="takes no instruction"):
        validation.check_instruction(adapter(), "m", "judge relevance")
    with pytest.raises(UnsupportedOperation, match="has no text tokenizer"):
        validation.text_tokenizer(adapter(), "m")
