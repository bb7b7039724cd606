"""Wire models of Cohere's rerank and embed, v1 and v2."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, StrictBool, StrictInt, StrictStr
from typing_extensions import NotRequired, TypedDict

from infinity_server.schemas.common import Body, LowerFirstPriority, ModelOptions, at_least
from infinity_server.schemas.infinity import RerankWeights
from infinity_server.schemas.responses import Vector
from model_registry import InvalidInput


class CohereRerankRequest(ModelOptions):
    """Documents are strings or objects with a `text` field."""

    lower_priority_first = True
    priority: LowerFirstPriority = None
    query: StrictStr
    documents: list[Any]
    top_n: StrictInt | None = Field(default=None, ge=1)
    return_documents: StrictBool | None = None
    # Each document is scored on its first tokens only (the answer keeps the whole text).
    max_tokens_per_doc: StrictInt | None = Field(default=None, ge=1)
    # Extensions.
    raw_scores: StrictBool = False
    instruction: StrictStr | None = None  # an LLM reranker's instruction for this request
    # Models with several outputs (BGE-M3) rank by their weighted parts (docs/rerank.md).
    weights: RerankWeights | None = None
    return_parts: StrictBool = False

    def texts(self) -> list[str]:
        """The documents as strings; anything but a string or `{text: string}` is `InvalidInput`."""
        texts = []
        for i, document in enumerate(self.documents):
            if isinstance(document, dict) and isinstance(document.get("text"), str):
                texts.append(document["text"])
            elif isinstance(document, str):
                texts.append(document)
            else:
                raise InvalidInput(
                    f"document {i} must be a string or an object with a string 'text' field", param="documents"
                )
        return texts


CohereEmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
InputType = Literal["search_document", "search_query", "classification", "clustering", "image"]

#: Cohere's input_type -> the model prompt used when the model has one (see docs/dialects/cohere.md).
ROLES: dict[str, str | None] = {
    "search_query": "query",
    "search_document": "document",
    "classification": "classification",
    "clustering": "clustering",
    "image": None,
}


class TextPart(Body):
    type: Literal["text"]
    text: Annotated[StrictStr, Field(min_length=1)]


class ImageUrl(Body):
    url: StrictStr


class ImagePart(Body):
    type: Literal["image_url"]
    image_url: ImageUrl


class EmbedInput(Body):
    """One v2 input: its text parts are joined into one text, or it is exactly one image."""

    content: Annotated[list[Annotated[TextPart | ImagePart, Field(discriminator="type")]], Field(min_length=1)]


class CohereEmbedRequest(Body):
    """`POST /v1/embed` and `POST /v2/embed`: `texts`, `images` (data URIs) or v2 `inputs`."""

    model: StrictStr
    texts: list[StrictStr] | None = None
    images: list[StrictStr] | None = None
    inputs: list[EmbedInput] | None = None
    input_type: InputType | None = None
    embedding_types: Annotated[list[CohereEmbeddingType], Field(min_length=1)] | None = None
    output_dimension: Annotated[
        StrictInt | None, AfterValidator(at_least(1, "output_dimension")), Field(json_schema_extra={"minimum": 1})
    ] = None
    truncate: Literal["NONE", "START", "END"] = "END"
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    lower_priority_first = True
    priority: LowerFirstPriority = None

    def given(self) -> str:
        """Which of texts, images and inputs the body holds; exactly one is accepted."""
        present = [name for name in ("texts", "images", "inputs") if getattr(self, name) is not None]
        if len(present) != 1:
            raise InvalidInput(
                f"send exactly one of texts, images and inputs; got {', '.join(present) or 'none'}", param="texts"
            )
        return present[0]


class CohereEmbedResponse(TypedDict):
    """`embeddings` is a list of float vectors (v1 without embedding_types) or `{type: vectors}`."""

    id: str
    response_type: Literal["embeddings_floats", "embeddings_by_type"]
    embeddings: list[Vector] | dict[str, list[Vector]]
    texts: list[str]
    meta: dict[str, Any]


class CohereDocument(TypedDict):
    text: str


class CohereResult(TypedDict):
    index: int
    relevance_score: float | None
    document: NotRequired[CohereDocument]
    #: An extension: a hybrid rerank's score per output, with `return_parts`.
    parts: NotRequired[dict[str, float]]


class CohereRerankResponse(TypedDict):
    id: str
    results: list[CohereResult]
    meta: dict[str, Any]
