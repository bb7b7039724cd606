"""Request fields every dialect shares, defined once: the model, priority and truncation options."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from model_registry import InvalidInput

#: Lower numbers run first; raising a request above the default may need the `priority` scope.
Priority = Annotated[StrictInt | None, Field(ge=-100, le=100)]
NonEmpty = Annotated[StrictStr, Field(min_length=1)]


def _zero_is_all(value: int | None) -> int | None:
    return None if value == 0 else value


#: A Matryoshka cut; 0 means the whole vector, as in Infinity (whose client sends 0 by default).
Dimensions = Annotated[StrictInt | None, AfterValidator(_zero_is_all)]
TruncationDirection = Literal["left", "right", "Left", "Right"]


class EngineOptions(BaseModel):
    """The engine's options as extensions on every dialect's body: truncation and priority."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    truncate: StrictBool | None = None
    priority: Priority = None


def _not_zero(value: int | None) -> int | None:
    if value == 0:
        raise ValueError("truncate_prompt_tokens must be -1 (the model's limit) or a positive token count")
    return value


class PromptTokenLimit(BaseModel):
    """vLLM's `truncate_prompt_tokens`: -1 cuts texts at the model's limit, k keeps each text's
    last k tokens (special tokens included, as vLLM counts them); it overrides `truncate`."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    truncate_prompt_tokens: Annotated[StrictInt | None, Field(ge=-1), AfterValidator(_not_zero)] = None

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

    model: StrictStr


def one_or_many(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def media_strings(value: Any, param: str = "input") -> list[str]:
    """Image or audio inputs: URLs or data URIs, one string or a non-empty list of strings."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    raise InvalidInput("image and audio inputs must be URLs or data URIs (strings), not token ids", param=param)
