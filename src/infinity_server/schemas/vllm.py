"""Wire models of vLLM's `POST /score` (`/v1/score`), rerank (`/v1/rerank`, `/v2/rerank`) and `POST /pooling`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr
from typing_extensions import TypedDict

from infinity_server.encoding import EncodingFormat
from infinity_server.schemas.common import (
    MAX_COUNT,
    Body,
    Dimensions,
    LowerFirstPriority,
    ModelOptions,
    PromptTokenLimit,
    one_or_many,
)
from infinity_server.schemas.openai import EmbeddingInput, input_list
from infinity_server.schemas.responses import FloatMatrix, Vector
from model_registry import InvalidInput

Texts = StrictStr | Annotated[list[StrictStr], Field(min_length=1)]


class VllmOptions(ModelOptions, PromptTokenLimit):
    """What vLLM's score and pooling bodies share. vLLM's fields that would change the answer are
    served, or refused (400) when set to what is not served, never ignored."""

    lower_priority_first = True
    priority: LowerFirstPriority = None
    model_family = "embed"
    # vLLM's side to cut when a text is cut (its default keeps the last tokens of `k`).
    truncation_side: Literal["left", "right"] | None = None
    add_special_tokens: StrictBool = True
    padding: Literal["max_length", "do_not_pad"] | None = None

    def truncation(self, truncate: bool | None) -> dict[str, Any]:
        options = super().truncation(truncate)
        if self.truncation_side is not None:
            options["truncation_direction"] = self.truncation_side
        return options

    def refuse_unserved(self) -> None:
        """A 400 for each vLLM option this server does not serve, set to other than its default."""
        if not self.add_special_tokens:
            raise InvalidInput(
                "add_special_tokens: false is not served: texts run with their special tokens",
                param="add_special_tokens",
            )
        if self.padding == "max_length":
            raise InvalidInput("padding: max_length is not served: texts run at their own length", param="padding")


class Activation(Body):
    """`use_activation: false` (or vLLM's older `activation`, `softmax`) asks for a cross-encoder's
    raw logits instead of its activated scores."""

    use_activation: StrictBool | None = None
    activation: StrictBool | None = None
    softmax: StrictBool | None = None

    def raw_scores(self) -> bool:
        """vLLM's rule: `use_activation`, else the older names; unset applies the activation."""
        chosen = next((v for v in (self.use_activation, self.activation, self.softmax) if v is not None), True)
        return not chosen


class ScoreRequest(VllmOptions, Activation):
    """`text_1` and `text_2` each a string or a list: 1 to 1, 1 to N, or N to N pairs (vLLM's rule)."""

    model_family = "rerank"
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
    """vLLM's `UsageInfo` as it writes it: `prompt_tokens_details` is always null for pooling models."""

    prompt_tokens: int
    total_tokens: int
    completion_tokens: int
    prompt_tokens_details: None


class ScoreResponse(TypedDict):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[ScoreData]
    usage: VllmUsage


class VllmRerankRequest(VllmOptions, Activation):
    """vLLM's rerank body (Jina's shape): `documents` ranked against `query`, best first; `top_n` 0
    (the default) or less answers every document."""

    model_family = "rerank"
    query: StrictStr
    documents: list[StrictStr]
    top_n: Annotated[StrictInt, Field(le=MAX_COUNT)] = 0


class VllmRerankDocument(TypedDict):
    """vLLM writes both keys; `multi_modal` holds a multimodal document, which is not served here."""

    text: str
    multi_modal: None


class VllmRerankResult(TypedDict):
    index: int
    document: VllmRerankDocument
    relevance_score: float


class VllmRerankUsage(TypedDict):
    prompt_tokens: int
    total_tokens: int


class VllmRerankResponse(TypedDict):
    id: str
    model: str
    usage: VllmRerankUsage
    results: list[VllmRerankResult]


class PoolingRequest(VllmOptions):
    """Texts or token-id lists; `task` "embed" asks for the pooled vector, "token_embed" for token
    vectors (unset: token vectors when the model has them). `dimensions` cuts a pooled vector.
    `use_activation: false` (vLLM's pooler output before normalisation) is served only by models
    that do not normalise; base64 is little-endian float32 (`embed_dtype`, `endianness`)."""

    input: EmbeddingInput
    encoding_format: EncodingFormat = "float"
    task: Literal["embed", "token_embed"] | None = None
    dimensions: Dimensions = None
    use_activation: StrictBool | None = None
    embed_dtype: Literal["float32"] = "float32"
    endianness: Literal["native", "little"] = "native"

    def inputs(self) -> list[str] | list[list[int]]:
        return input_list(self.input)


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
