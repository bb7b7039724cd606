"""Wire models of the OpenAI (and Infinity) embeddings dialect."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

TokenList = Annotated[list[StrictInt], Field(min_length=1)]
EmbeddingInput = StrictStr | list[StrictStr] | TokenList | list[TokenList]


class EmbeddingRequest(BaseModel):
    """`POST /v1/embeddings` and Infinity's `POST /embeddings`, plus this server's extensions."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    model: StrictStr
    input: EmbeddingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
    user: StrictStr | None = None
    # Infinity's field; image and audio inputs are URLs or data URIs.
    modality: Literal["text", "image", "audio"] = "text"
    # Extensions.
    prompt_name: StrictStr | None = None
    truncate: StrictBool | None = None
    priority: StrictInt | None = Field(default=None, ge=-100, le=100)
    embedding_type: Literal["float32", "int8", "uint8", "binary", "ubinary"] = "float32"

    def inputs(self) -> list[str] | list[list[int]]:
        """The input as a list of texts or a list of token-id lists."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if value and isinstance(value[0], int):
            return [value]
        return value  # type: ignore[return-value]
