"""Wire models of Cohere's rerank and embed, v1 and v2."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, StrictBool, StrictInt, StrictStr
from typing_extensions import NotRequired, TypedDict

from infinity_server.schemas.common import MAX_COUNT, Body, Count, LowerFirstPriority, ModelOptions, Name, at_least
from infinity_server.schemas.infinity import RerankWeights
from infinity_server.schemas.responses import Vector
from model_registry import InvalidInput

#: The most characters of a client's field names an error quotes.
_SHOWN = 64
#: The most parts one v2 embed input may have (its texts are joined into one).
CONTENT_PARTS = 256
#: The most fields a v1 rerank may rank on.
RANK_FIELDS = 64


class CohereRerankRequest(ModelOptions):
    """Cohere v2's rerank body (and v1's core): `documents` are strings, as in Cohere's v2 API
    (or `{text}` objects, which its earlier clients sent).

    Documents are taken as any JSON value here so that a wrong one is a 400 naming its index."""

    lower_priority_first = True
    priority: LowerFirstPriority = None
    query: StrictStr
    documents: list[Any]
    top_n: StrictInt | None = Field(default=None, ge=1, le=MAX_COUNT)
    return_documents: StrictBool | None = None
    # Each document is scored on its first tokens only (the answer keeps the whole text).
    max_tokens_per_doc: StrictInt | None = Field(default=None, ge=1, le=MAX_COUNT)
    # Extensions.
    raw_scores: StrictBool = False
    instruction: StrictStr | None = None  # an LLM reranker's instruction for this request
    # Models with several outputs (BGE-M3) rank by their weighted parts (docs/rerank.md).
    weights: RerankWeights | None = None
    return_parts: StrictBool = False

    def texts(self) -> list[str]:
        """The texts the model ranks: strings, or `{text}` objects as Cohere's earlier v2 clients
        send them; any other document is `InvalidInput`."""
        texts = []
        for i, document in enumerate(self.documents):
            if isinstance(document, dict) and set(document) == {"text"} and isinstance(document["text"], str):
                texts.append(document["text"])
            elif isinstance(document, str):
                texts.append(document)
            else:
                raise InvalidInput(
                    f"document {i} is {_json_type(document)}; /v2/rerank takes strings (or {{text}} objects), as "
                    "Cohere's v2 does: write an object's fields into its text (one 'key: value' line each), or "
                    "send it to /v1/rerank with rank_fields",
                    param="documents",
                )
        return texts

    def returned(self, index: int) -> dict[str, Any]:
        """Document `index` as `return_documents` answers it: `{text}` for a string, an object as given."""
        document = self.documents[index]
        return {"text": document} if isinstance(document, str) else dict(document)


class CohereV1RerankRequest(CohereRerankRequest):
    """Cohere v1's rerank body: documents are strings or objects of string fields; an object is
    ranked on its `rank_fields` (default `text`), as `ranked_text` writes them."""

    rank_fields: Annotated[list[Name], Field(min_length=1, max_length=RANK_FIELDS)] | None = None

    def texts(self) -> list[str]:
        fields = self.rank_fields or ["text"]
        if len(set(fields)) < len(fields):
            repeated = next(name for name, count in Counter(fields).items() if count > 1)
            raise InvalidInput(f"rank_fields names {_shown(repeated)} twice; name each field once", param="rank_fields")
        return [ranked_text(document, i, fields) for i, document in enumerate(self.documents)]


def ranked_text(document: Any, index: int, fields: list[str]) -> str:
    """The text the model reads for one v1 document: a string as it is; an object's one ranked field
    as its value alone, or several as one `key: value` line each, in `fields`' order (the YAML-like
    layout Cohere recommends for structured documents).

    Each ranked field must be a string in every object, and the fields are distinct, so the texts
    hold at most every value of the body once plus its field names: the body limit bounds them, and
    each text is held to `max_input_chars` as a string document is."""
    if isinstance(document, str):
        return document
    if not isinstance(document, dict):
        raise InvalidInput(
            f"document {index} is {_json_type(document)}; a document is a string or an object of string fields",
            param="documents",
        )
    values = [_field(document, index, name, fields) for name in fields]
    if len(fields) == 1:
        return values[0]
    return "\n".join(f"{name}: {value}" for name, value in zip(fields, values, strict=True))


def _field(document: dict[str, Any], index: int, name: str, fields: list[str]) -> str:
    if name not in document:
        hint = "name the fields to rank on in rank_fields" if fields == ["text"] else f"rank_fields is {_shown(fields)}"
        raise InvalidInput(f"document {index} has no field {_shown(name)}; {hint}", param="documents")
    value = document[name]
    if not isinstance(value, str):
        raise InvalidInput(
            f"document {index}'s field {_shown(name)} is {_json_type(value)}; ranked fields must be strings",
            param="documents",
        )
    return value


def _shown(value: str | list[str]) -> str:
    """A client's field name (or list of them) as a message quotes it, cut to `_SHOWN` characters."""
    text = repr(value)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text):,} characters)"


def _json_type(value: Any) -> str:
    """The JSON type of a decoded value, as an error names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else "a string"


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
    """One v2 input: its text parts joined into one text (one per line), at most one image, or
    both, which a model that reads a text and an image together (Qwen3-VL-Embedding, GME) embeds
    as one input; other models refuse that input with what they take."""

    content: Annotated[
        list[Annotated[TextPart | ImagePart, Field(discriminator="type")]],
        Field(min_length=1, max_length=CONTENT_PARTS),
    ]


class CohereEmbedRequest(Body):
    """`POST /v1/embed` and `POST /v2/embed`: `texts`, `images` (data URIs) or v2 `inputs`."""

    model: Name
    texts: list[StrictStr] | None = None
    images: list[StrictStr] | None = None
    inputs: list[EmbedInput] | None = None
    input_type: InputType | None = None
    embedding_types: Annotated[list[CohereEmbeddingType], Field(min_length=1, max_length=8)] | None = None
    output_dimension: Annotated[
        Count | None,
        AfterValidator(at_least(1, "output_dimension")),
        Field(json_schema_extra={"minimum": 1}),
    ] = None
    truncate: Literal["NONE", "START", "END"] = "END"
    max_tokens: StrictInt | None = Field(default=None, ge=1, le=MAX_COUNT)
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


class CohereResult(TypedDict):
    index: int
    relevance_score: float | None
    #: `{text}` for a string document, a v1 object document as it was sent.
    document: NotRequired[Annotated[dict[str, Any], Field(description="{text}, or the object document as sent")]]
    #: An extension: a hybrid rerank's score per output, with `return_parts`.
    parts: NotRequired[dict[str, float]]


class CohereRerankResponse(TypedDict):
    id: str
    results: list[CohereResult]
    meta: dict[str, Any]
