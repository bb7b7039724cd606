"""Request fields every dialect shares, defined once: the model, priority and truncation options."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from model_registry import InvalidInput

#: Higher numbers run first; raising a request above the default needs the `priority` scope (or
#: `server.allow_client_priority`), lowering it is free.
Priority = Annotated[StrictInt | None, Field(ge=-100, le=100)]


def _negated(value: int | None) -> int | None:
    # what `Body.engine_priority` does for a body with `lower_priority_first`
    return None if value is None else -value


#: Cohere's and vLLM's own `priority`, where lower numbers run first (0, the default, the highest):
#: validated into the engine's, its negation. Such a body says `lower_priority_first`.
LowerFirstPriority = Annotated[StrictInt | None, Field(ge=-100, le=100), AfterValidator(_negated)]
NonEmpty = Annotated[StrictStr, Field(min_length=1)]
#: The most characters a name in a request may have (a model, a prompt, a task, a user, a file id):
#: enough for any real one, and a name then costs nothing to look up or to quote in an error.
NAME_CHARS = 256
Name = Annotated[StrictStr, Field(max_length=NAME_CHARS)]
OptionalName = Annotated[StrictStr | None, Field(max_length=NAME_CHARS)]
#: The largest count a numeric option may ask for (dimensions, top_n, tokens): beyond any model.
MAX_COUNT = 1_000_000


def at_least(lowest: int, param: str) -> Callable[[int | None], int | None]:
    """A check that a count is `lowest` or more: a 400 naming `param` (a wrong type stays a 422)."""

    def check(value: int | None) -> int | None:
        if value is not None and value < lowest:
            raise InvalidInput(f"{param} must be {lowest} or more, got {value}", param=param)
        return value

    return check


def _zero_is_all(value: int | None) -> int | None:
    return None if value == 0 else value


#: A Matryoshka cut: 1 up to the model's dimensions (a larger cut is a 400 naming both).
Count = Annotated[StrictInt, Field(le=MAX_COUNT)]
Dimensions = Annotated[Count | None, AfterValidator(at_least(1, "dimensions")), Field(json_schema_extra={"minimum": 1})]
#: Infinity's own paths: 0 means the whole vector, as in Infinity, whose client sends 0 by default.
InfinityDimensions = Annotated[
    Count | None,
    AfterValidator(at_least(0, "dimensions")),
    AfterValidator(_zero_is_all),
    Field(json_schema_extra={"minimum": 0}),
]
TruncationDirection = Literal["left", "right", "Left", "Right"]


def _null_allowed(schema: dict[str, Any], cls: type[Any]) -> None:
    """The document says what `Body` accepts: null for every field that has a default, and no
    `model` needed where the dialect lets it be left out (`Body.model_family`)."""
    if getattr(cls, "model_family", None) is not None and "model" in schema.get("required", ()):
        schema["required"] = [name for name in schema["required"] if name != "model"]
        schema["properties"]["model"]["description"] = "left out: the route's default model (docs/dialects)"
    required = set(schema.get("required", ()))
    for name, field in schema.get("properties", {}).items():
        if name in required or _accepts_null(field):
            continue
        kept = {k: field.pop(k) for k in ("title", "default", "description", "minimum") if k in field}
        schema["properties"][name] = {"anyOf": [field, {"type": "null"}], **kept}


def _accepts_null(field: dict[str, Any]) -> bool:
    return field.get("type") == "null" or any(_accepts_null(f) for f in field.get("anyOf", ()))


class Body(BaseModel):
    """A request body (or a part of one). `null` for a field that has a default means that default,
    as it does in OpenAI's API: litellm and dspy send `"encoding_format": null`, others `"user": null`."""

    model_config = ConfigDict(extra="ignore", frozen=True, json_schema_extra=_null_allowed)
    #: The body's `priority` is a `LowerFirstPriority` (its dialect runs lower numbers first).
    lower_priority_first: ClassVar[bool] = False

    @classmethod
    def engine_priority(cls, asked: int) -> int:
        """A `priority` as this body's dialect says it, in the engine's terms (higher runs first):
        the one place the sign convention is converted (`LowerFirstPriority` validates through it)."""
        return -asked if cls.lower_priority_first else asked

    #: A body whose dialect lets `model` be left out (Infinity's, vLLM's) names the route family
    #: whose default model it then runs (`api.common.model_for`).
    model_family: ClassVar[str | None] = None

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {k: v for k, v in data.items() if v is not None or k not in fields or fields[k].is_required()}


class EngineOptions(Body):
    """The engine's options as extensions on every dialect's body: truncation and priority."""

    truncate: StrictBool | None = None
    priority: Priority = None


def _not_zero(value: int | None) -> int | None:
    if value == 0:
        raise ValueError("truncate_prompt_tokens must be -1 (the model's limit) or a positive token count")
    return value


class PromptTokenLimit(Body):
    """vLLM's `truncate_prompt_tokens`: -1 cuts texts at the model's limit, k keeps each text's
    last k tokens (special tokens included, as vLLM counts them); it overrides `truncate`."""

    truncate_prompt_tokens: Annotated[StrictInt | None, Field(ge=-1, le=MAX_COUNT), AfterValidator(_not_zero)] = None

    def truncation(self, truncate: bool | None) -> dict[str, Any]:
        """`registry.embed`'s truncation options for this body, whose own `truncate` is given."""
        limit = self.truncate_prompt_tokens
        if limit is None:
            return {"truncate": truncate}
        if limit == -1:
            return {"truncate": True}
        return {"truncate": True, "truncation_direction": "left", "max_tokens": limit}


class ModelOptions(EngineOptions):
    """`EngineOptions` with the (required) model name."""

    model: Name


class AdapterChoice(Body):
    """`adapter`: one of the LoRA adapters the model's entry lists (`adapters`); `task`: the same
    choice by jina-embeddings-v3's word for its adapters (retrieval.query, retrieval.passage, ...)."""

    adapter: OptionalName = None
    task: OptionalName = None

    @model_validator(mode="after")
    def _one_choice(self) -> AdapterChoice:
        if self.adapter is not None and self.task is not None and self.adapter != self.task:
            raise ValueError("'adapter' and 'task' choose the same thing, the model's adapter; send one")
        return self

    def chosen_adapter(self) -> str | None:
        return self.adapter if self.adapter is not None else self.task


def fields_only_in(data: Mapping[str, Any], model: type[Body], other: type[Body]) -> list[str]:
    """The fields `data` sets (not null) that `model` declares and `other` does not: on a path two
    dialects serve with the same core fields, these tell `model`'s body from `other`'s."""
    mine, theirs = model.model_fields, other.model_fields
    return [name for name, value in data.items() if value is not None and name in mine and name not in theirs]


def one_or_many(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def media_strings(value: Any, param: str = "input") -> list[str]:
    """Image or audio inputs: URLs or data URIs, one string or a non-empty list of strings."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    if isinstance(value, list) and any(isinstance(v, InputParts) for v in value):
        raise InvalidInput(
            "an input object ({text, image}) names its own parts; send it without modality (or with modality text)",
            param=param,
        )
    raise InvalidInput("image and audio inputs must be URLs or data URIs (strings), not token ids", param=param)


class InputParts(Body):
    """One embedding input given as an object: a text, an image (a URL or data URI), or both, which
    a model that reads them together (Qwen3-VL-Embedding, GME) embeds as one input, one vector."""

    text: StrictStr | None = None
    image: StrictStr | None = None

    @model_validator(mode="after")
    def _some_part(self) -> InputParts:
        if self.text is None and self.image is None:
            raise InvalidInput("an input object holds a text, an image or both; this one holds neither", param="input")
        return self
