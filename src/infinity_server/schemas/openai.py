"""Wire models of the OpenAI (and Infinity) embeddings dialect and the model list."""

from __future__ import annotations

from typing import Annotated, Literal, cast

from pydantic import Field, StrictInt, StrictStr

from infinity_server.encoding import EmbeddingType, EncodingFormat
from infinity_server.schemas.common import (
    AdapterChoice,
    Dimensions,
    InfinityDimensions,
    InputParts,
    ModelOptions,
    OptionalName,
    PromptTokenLimit,
    media_strings,
)

TokenList = Annotated[list[StrictInt], Field(min_length=1)]
EmbeddingInput = StrictStr | list[StrictStr] | TokenList | list[TokenList]
#: `/v1/embeddings` also takes input objects (`{"text", "image"}`) among its texts: a text and an
#: image together are one input for a model that reads them together.
PartsInput = Annotated[list[StrictStr | InputParts], Field(min_length=1)]


def input_list(value: str | list[str] | list[int] | list[list[int]]) -> list[str] | list[list[int]]:
    """An `EmbeddingInput` as a list of texts or a list of token-id lists."""
    if isinstance(value, str):
        return [value]
    if value and isinstance(value[0], int):
        return [value]
    return value  # type: ignore[return-value]


class EmbeddingRequest(ModelOptions, PromptTokenLimit, AdapterChoice):
    """`POST /v1/embeddings`, plus this server's extensions and vLLM's `truncate_prompt_tokens`.

    A `null` optional field means its default (litellm and dspy send `"encoding_format": null`)."""

    input: EmbeddingInput | PartsInput
    encoding_format: EncodingFormat = "float"
    dimensions: Dimensions = None
    user: OptionalName = None
    # Infinity's field; image and audio inputs are URLs or data URIs.
    modality: Literal["text", "image", "audio"] = "text"
    # Extensions.
    prompt_name: OptionalName = None
    embedding_type: EmbeddingType = "float32"
    # An input longer than the model's length without truncation: refused, windowed, or read whole.
    long_inputs: Literal["error", "chunk", "late"] = "error"
    # Late chunking's character spans [start, end) per input; without them, each input's sentences.
    spans: list[list[tuple[StrictInt, StrictInt]]] | None = None

    def inputs(self) -> list[str] | list[list[int]] | list[str | InputParts]:
        """The input as a list of texts, of token-id lists, or of texts and input objects."""
        value = self.input
        if isinstance(value, list) and any(isinstance(v, InputParts) for v in value):
            return [v for v in value if isinstance(v, str | InputParts)]
        return input_list(cast(EmbeddingInput, value))

    def media_inputs(self) -> list[str]:
        return media_strings(self.input)


class InfinityEmbeddingRequest(EmbeddingRequest):
    """Infinity's `POST /embeddings`: the same body, where `dimensions: 0` means the whole vector."""

    model_family = "embed"

    dimensions: InfinityDimensions = None
