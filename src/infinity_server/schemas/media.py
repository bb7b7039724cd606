"""Wire models of the media routes: Infinity's `/embeddings_image`, `/embeddings_audio`, image rerank."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr

from infinity_server.schemas.common import (
    MAX_COUNT,
    Body,
    InfinityDimensions,
    InputParts,
    Name,
    NonEmpty,
    OptionalName,
    Priority,
)


class MediaEmbeddingRequest(Body):
    """Infinity's `POST /embeddings_image` and `/embeddings_audio`: URLs or data URIs."""

    model_family = "embed"
    model: Name
    input: NonEmpty | list[NonEmpty]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: InfinityDimensions = None
    user: OptionalName = None
    priority: Priority = None

    def inputs(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class MediaRerankRequest(Body):
    """`POST /v1/rerank/images` (and `/v1/rerank/audio`): media documents ranked against a text query.
    A document is a URL or data URI, or an object `{"image", "text"}`: an image with a text beside
    it, one document for a model that reads both (Qwen3-VL-Reranker, Qwen3-VL-Embedding, GME)."""

    model: Name
    query: NonEmpty
    documents: Annotated[list[NonEmpty | InputParts], Field(min_length=1)]
    top_n: StrictInt | None = Field(default=None, ge=1, le=MAX_COUNT)
    return_documents: StrictBool = False
    #: A cross-encoder's instruction for this request (Qwen3-VL-Reranker's).
    instruction: StrictStr | None = None
    priority: Priority = None
