"""Wire models of vLLM's `POST /score` (`/v1/score`) and `POST /pooling`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictStr
from typing_extensions import TypedDict

from infinity_server.encoding import EncodingFormat
from infinity_server.schemas.common import LowerFirstPriority, ModelOptions, PromptTokenLimit, one_or_many
from infinity_server.schemas.responses import FloatMatrix, Vector
from model_registry import InvalidInput

Texts = StrictStr | Annotated[list[StrictStr], Field(min_length=1)]


class ScoreRequest(ModelOptions, PromptTokenLimit):
    """`text_1` and `text_2` each a string or a list: 1 to 1, 1 to N, or N to N pairs (vLLM's rule)."""

    lower_priority_first = True
    priority: LowerFirstPriority = None
    text_1: Texts
    text_2: Texts
    encoding_format: EncodingFormat = "float"

    def pairs(self) -> list[tuple[str, str]]:
        first, second = one_or_many(self.text_1), one_or_many(self.text_2)
        if len(first) == 1:
            return [(first[0], t) for t in second]
        if len(first) != len(second):
            raise InvalidInput(
                f"text_1 has {len(first)} texts and text_2 {len(second)}; give one text_1, or as many as text_2",
                param="text_1",
            )
        return list(zip(first, second, strict=True))


class ScoreData(TypedDict):
    index: int
    object: Literal["score"]
    score: float


class VllmUsage(TypedDict):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int


class ScoreResponse(TypedDict):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[ScoreData]
    usage: VllmUsage


class PoolingRequest(ModelOptions, PromptTokenLimit):
    lower_priority_first = True
    priority: LowerFirstPriority = None
    input: Texts
    encoding_format: EncodingFormat = "float"

    def texts(self) -> list[str]:
        return one_or_many(self.input)


class PoolingData(TypedDict):
    index: int
    object: Literal["pooling"]
    data: Annotated[Vector | list[Vector] | FloatMatrix, Field(description="a vector, or one per token")]


class PoolingResponse(TypedDict):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[PoolingData]
    usage: VllmUsage
