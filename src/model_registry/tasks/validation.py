"""What a request may ask of a model, checked before any work: its inputs, outputs, prompt,
truncation side and instruction. Every refusal is an `InvalidInput` (400) or an
`UnsupportedOperation` that names the parameter.
"""

from __future__ import annotations

from collections.abc import Sequence

from model_registry.adapters.base import Adapter
from model_registry.adapters.text import TextTokenizer
from model_registry.config import RegistryConfig
from model_registry.errors import InvalidInput, UnsupportedOperation
from model_registry.types import Capability, Content, Media, Mixed, Modality, Output, Text, TokenIds

RawInput = str | Sequence[int] | Content


def contents(inputs: Sequence[RawInput], config: RegistryConfig) -> list[Content]:
    """The request's inputs as contents: a non-empty list within the registry's limits."""
    _check_list(inputs, config)
    return [content(i, value, config.max_input_chars) for i, value in enumerate(inputs)]


def _check_list(inputs: object, config: RegistryConfig) -> None:
    if isinstance(inputs, str) or not isinstance(inputs, Sequence):
        raise InvalidInput("input must be a list", param="input")
    if not inputs:
        raise InvalidInput("input must not be empty", param="input")
    limit = config.max_inputs_per_request
    if len(inputs) > limit:
        raise InvalidInput(f"input has {len(inputs)} items; at most {limit} are accepted per request", param="input")


def texts(inputs: Sequence[str], config: RegistryConfig, refusal: str, param: str = "input") -> list[str]:
    """The request's inputs, which must all be texts (else `refusal`)."""
    checked = contents(inputs, config)
    if not all(isinstance(c, Text) for c in checked):
        raise InvalidInput(refusal, param=param)
    return [c.text for c in checked if isinstance(c, Text)]


def texts_or_pairs(
    inputs: Sequence[str | Sequence[str]], config: RegistryConfig, refusal: str
) -> list[tuple[str, str | None]]:
    """The request's inputs, each a text or a pair of texts `[text, text_pair]` (as the text and
    its pair's second text, else None), each text within the limits a single text has; an input
    of anything else (token ids, media) is `refusal`."""
    _check_list(inputs, config)
    return [_text_or_pair(i, value, config.max_input_chars, refusal) for i, value in enumerate(inputs)]


def _text_or_pair(index: int, value: object, max_chars: int, refusal: str) -> tuple[str, str | None]:
    members: Sequence[object] = [value]
    if isinstance(value, Sequence) and not isinstance(value, str) and all(isinstance(v, str) for v in value):
        if len(value) != 2:
            raise InvalidInput(
                f"input {index} is a list of {len(value)} texts; a pair is two, [text, text_pair]", param="input"
            )
        members = value
    checked = [content(index, member, max_chars) for member in members]
    texts = [c.text for c in checked if isinstance(c, Text)]
    if len(texts) != len(checked):
        raise InvalidInput(refusal, param="input")
    return texts[0], texts[1] if len(texts) == 2 else None


def content(index: int, raw: object, max_chars: int) -> Content:
    value: object = raw
    if isinstance(raw, str):
        value = Text(raw)
    elif isinstance(raw, Sequence) and not isinstance(raw, (bytes, bytearray)):
        if not raw or not all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
            raise InvalidInput(f"input {index} must be a string or a non-empty list of token ids", param="input")
        value = TokenIds(tuple(int(t) for t in raw))
    if isinstance(value, Mixed):
        if not isinstance(value.image, Media) or value.image.modality != Modality.IMAGE:
            raise InvalidInput(f"input {index} pairs its text with something other than an image", param="input")
        _check_text(index, value.text, max_chars)
    if isinstance(value, Text):
        _check_text(index, value.text, max_chars)
    if not isinstance(value, (Text, TokenIds, Media, Mixed)):
        raise InvalidInput(f"input {index} is of an unsupported type {type(raw).__name__}", param="input")
    return value


def _check_text(index: int, text: str, max_chars: int) -> None:
    if not text.strip():
        raise InvalidInput(f"input {index} is empty; every input needs some text", param="input")
    if len(text) > max_chars:
        raise InvalidInput(f"input {index} has {len(text):,} characters; the limit is {max_chars:,}", param="input")


def require_mixed(model: str, adapter: Adapter, contents: Sequence[Content]) -> None:
    """`UnsupportedOperation` for an input holding a text and an image together (`Mixed`) unless
    the model reads both in one sequence; the message names what each input may be instead."""
    if adapter.mixed_inputs:
        return
    index = next((i for i, c in enumerate(contents) if isinstance(c, Mixed)), None)
    if index is None:
        return
    caps = adapter.capabilities
    kinds = [
        name
        for name, capability in (
            ("text", Capability.EMBED_TEXT),
            ("image", Capability.EMBED_IMAGE),
            ("audio clip", Capability.EMBED_AUDIO),
        )
        if capability in caps
    ]
    takes = " or ".join(f"one {k}" for k in kinds) or "no embedding inputs"
    raise UnsupportedOperation(
        f"input {index} holds a text and an image together; the model '{model}' takes {takes} per input, "
        "so send them as separate inputs (a text and an image in one input are read together by "
        "Qwen3-VL-Embedding and GME)",
        param="input",
    )


def require_outputs(model: str, adapter: Adapter, wanted: frozenset[Output]) -> None:
    """`UnsupportedOperation` unless the model produces every output in `wanted`."""
    caps = adapter.capabilities
    needed = {Output.SPARSE: Capability.SPARSE, Output.MULTIVECTOR: Capability.MULTIVECTOR}
    missing = [o.value for o in wanted if o in needed and needed[o] not in caps]
    dense_capable = {Capability.EMBED_TEXT, Capability.EMBED_IMAGE, Capability.EMBED_AUDIO} & caps
    if Output.DENSE in wanted and not dense_capable:
        missing.append("dense")
    if missing:
        have = ", ".join(sorted(c.value for c in caps)) or "none"
        raise UnsupportedOperation(
            f"the model '{model}' cannot produce {', '.join(missing)} output; its capabilities are: {have}",
            param="model",
        )


def require(model: str, adapter: Adapter, capability: Capability, verb: str) -> None:
    """`UnsupportedOperation` unless the model has `capability` (`verb` says what it cannot do)."""
    if capability not in adapter.capabilities:
        have = ", ".join(sorted(c.value for c in adapter.capabilities)) or "none"
        raise UnsupportedOperation(f"the model '{model}' cannot {verb}; its capabilities are: {have}", param="model")


def check_instruction_length(instruction: str | None, max_chars: int) -> None:
    """An instruction is held to the limit of any text a request carries (`max_input_chars`)."""
    if instruction is not None and len(instruction) > max_chars:
        raise InvalidInput(
            f"the instruction has {len(instruction)} characters, more than the server's limit of {max_chars} "
            "(max_input_chars)",
            param="instruction",
        )


def check_instruction(adapter: Adapter, model: str, instruction: str | None) -> None:
    if instruction is not None and not adapter.rerank_instructions:
        raise UnsupportedOperation(
            f"the model '{model}' takes no instruction; only LLM rerankers whose prompt has one do",
            param="instruction",
        )


def cut_left(adapter: Adapter, model: str, direction: str, *, pairs: bool = False) -> bool:
    """Whether to cut at the start; pair and classify inputs are cut by the task, before the adapter."""
    sides = ("right", "left") if pairs else adapter.truncation_sides
    if direction not in ("left", "right"):
        raise InvalidInput(
            f"truncation_direction must be left or right, got '{direction}'", param="truncation_direction"
        )
    if direction not in sides:
        raise UnsupportedOperation(
            f"the model '{model}' cuts over-long texts only on the {' or '.join(sides)}; "
            f"truncation_direction '{direction}' is not available for it",
            param="truncation_direction",
        )
    return direction == "left"


def prompt_text(adapter: Adapter, prompt_name: str | None, prompt: str | None) -> str:
    """The prompt a request asks for: its own text, a named one of the model's, or the default."""
    if prompt is not None:
        return prompt
    name = prompt_name or adapter.default_prompt_name
    if name is None:
        return ""
    if name not in adapter.prompts:
        known = ", ".join(sorted(adapter.prompts)) or "none"
        raise InvalidInput(f"unknown prompt_name '{name}'; this model's prompts are: {known}", param="prompt_name")
    return adapter.prompts[name]


def text_tokenizer(adapter: Adapter, model: str) -> TextTokenizer:
    tokenizer = adapter.text_tokenizer()
    if tokenizer is None:
        raise UnsupportedOperation(f"the model '{model}' has no text tokenizer to show", param="model")
    return tokenizer
