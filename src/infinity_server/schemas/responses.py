"""The answers' types: what the routes build and orjson writes, and what the API document says.

TypedDicts, so that mypy checks each handler's answer against its declared type at no cost on the
wire (no pydantic round-trip: a large answer's vectors stay numpy arrays until orjson writes them);
`openapi.py` describes the same types with pydantic. Shapes of one dialect only live beside its
requests (`schemas/tei.py`, `schemas/vllm.py`, `schemas/cohere.py`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, GetPydanticSchema, RootModel, WithJsonSchema
from pydantic_core import core_schema
from typing_extensions import NotRequired, TypedDict

# numpy arrays as the handlers hold them; orjson writes them as (nested) lists of numbers.
_ANY = GetPydanticSchema(lambda _type, _handler: core_schema.any_schema())
_NUMBERS = {"type": "array", "items": {"type": "number"}}
FloatVector = Annotated[np.ndarray, _ANY, WithJsonSchema(_NUMBERS)]
FloatMatrix = Annotated[np.ndarray, _ANY, WithJsonSchema({"type": "array", "items": _NUMBERS})]
IntVector = Annotated[np.ndarray, _ANY, WithJsonSchema({"type": "array", "items": {"type": "integer"}})]
#: A vector as floats, as int8/uint8/binary codes, or base64 of its bytes.
Vector = list[float] | list[int] | str | FloatVector


class ErrorDetail(TypedDict):
    message: str
    type: Literal[
        "invalid_request_error", "authentication_error", "permission_error", "rate_limit_error", "server_error"
    ]
    param: str | None
    code: Annotated[str, Field(description="a stable, machine-readable name of the error, e.g. model_not_found")]


class ErrorResponse(TypedDict):
    """Every error of every route but TEI's, in OpenAI's shape."""

    error: ErrorDetail


class TeiError(TypedDict):
    """TEI's error body: `error_type` is Validation, Overloaded, Unhealthy or Backend."""

    error: str
    error_type: str


class EitherError(RootModel[ErrorResponse | TeiError]):
    """OpenAI's error shape, or TEI's when the body was TEI's."""


class Usage(TypedDict):
    prompt_tokens: int
    total_tokens: int


class EmbeddingData(TypedDict):
    object: Literal["embedding"]
    embedding: Annotated[
        Vector | list[list[float]] | FloatMatrix, Field(description="the vector (a matrix for multi-vector output)")
    ]
    index: int
    shape: NotRequired[Annotated[list[int], Field(description="multi-vector output only: [tokens, width]")]]
    input: NotRequired[Annotated[int, Field(description="a PDF's page only: the input (file) it came from")]]
    page: NotRequired[Annotated[int, Field(description="a PDF's page only: its number in the document, from 1")]]


class EmbeddingResponse(TypedDict):
    object: Literal["list"]
    data: list[EmbeddingData]
    model: str
    usage: Usage
    id: NotRequired[str]  # Infinity's paths
    created: NotRequired[int]


class SpanVector(TypedDict):
    """Late chunking: one span's character offsets [start, end) and its vector."""

    start: int
    end: int
    embedding: list[float]


class LateEmbeddingData(TypedDict):
    object: Literal["embedding"]
    index: int
    spans: list[SpanVector]


class LateEmbeddingResponse(TypedDict):
    """`long_inputs: late`: one vector per span of each input."""

    object: Literal["list"]
    data: list[LateEmbeddingData]
    model: str
    usage: Usage
    id: NotRequired[str]  # Infinity's paths
    created: NotRequired[int]


class ModelStats(TypedDict):
    """Infinity's `stats` object (its client requires one): the model's queue."""

    queue_depth: int
    queue_tokens: int


class ModelEntry(TypedDict):
    id: str
    object: Literal["model"]
    created: int
    owned_by: Annotated[Literal["infinity"], Field(description="Infinity's value, which infinity_client requires")]
    kind: str
    capabilities: list[str]
    backend: str
    device: str
    dtype: str
    status: Annotated[str, Field(description="unloaded, loading, loaded or failed")]
    pinned: bool
    max_length: int | None
    dimensions: int | None
    footprint_bytes: int | None
    last_used: float | None
    queue_depth: int
    stats: ModelStats
    error: str | None
    details: NotRequired[dict[str, Any]]


class ModelList(TypedDict):
    object: Literal["list"]
    data: list[ModelEntry]


class RerankResult(TypedDict):
    relevance_score: float | None
    index: int
    #: The document as sent: a string, or an image rerank's object document (`{image, text}`).
    document: NotRequired[str | dict[str, str] | None]
    #: Image rerank of a PDF document: the page this result is (from 1); `index` is the document's.
    page: NotRequired[int]
    #: A hybrid rerank with `return_parts`: each output's score (dense, sparse, multivector).
    parts: NotRequired[dict[str, float]]


class RerankResponse(TypedDict):
    """Infinity's `/rerank`."""

    object: Literal["rerank"]
    id: str
    created: int
    model: str
    results: list[RerankResult]
    usage: Usage
    meta: dict[str, Any]


class ImageRerankResponse(TypedDict):
    """The image rerank routes, JSON and upload."""

    object: Literal["rerank"]
    results: list[RerankResult]
    model: str
    usage: Usage


class ClassLabel(TypedDict):
    label: str
    score: float


class ClassifyResponse(TypedDict):
    object: Literal["classify"]
    id: str
    created: int
    model: str
    data: list[list[ClassLabel]]
    usage: Usage


class SparseEntry(TypedDict):
    indices: IntVector
    values: FloatVector
    tokens: NotRequired[list[str]]


class MultivectorBase64(TypedDict):
    data: str
    shape: list[int]
    dtype: str


class Encoding(TypedDict):
    object: Literal["encoding"]
    index: int
    dense: NotRequired[Vector]
    sparse: NotRequired[SparseEntry]
    multivector: NotRequired[list[Vector] | MultivectorBase64 | FloatMatrix]
    input: NotRequired[Annotated[int, Field(description="a PDF's page only: the input it came from")]]
    page: NotRequired[Annotated[int, Field(description="a PDF's page only: its number in the document, from 1")]]


class EncodeResponse(TypedDict):
    object: Literal["list"]
    model: str
    data: list[Encoding]
    usage: Usage


class Health(TypedDict):
    unix: float


class Readiness(TypedDict):
    ready: bool
    pinned: NotRequired[Annotated[dict[str, str], Field(description="each pinned model's state")]]
    draining: NotRequired[Annotated[bool, Field(description="true while the server shuts down")]]
    loading_seconds: NotRequired[
        Annotated[dict[str, float], Field(description="pinned models loading now, with how long each load has run")]
    ]
    errors: NotRequired[
        Annotated[
            dict[str, str], Field(description="why a pinned model failed to load (it is retried on its back-off)")
        ]
    ]


class DeviceMemory(TypedDict):
    device: str
    budget_bytes: int
    charged_bytes: int


class EvictionCandidate(TypedDict):
    model: str
    lru_stamp: int


class LifecycleEventEntry(TypedDict):
    kind: str
    model: str
    device: str
    bytes: int
    at: float
    seconds: float
    reason: str | None
    candidates: list[EvictionCandidate]


class MemoryResponse(TypedDict):
    devices: list[DeviceMemory]
    events: list[LifecycleEventEntry]


class EmbeddingUpload(TypedDict):
    """multipart/form-data of the embeddings upload route: the files, in order, and options."""

    model: str
    file: Annotated[
        list[bytes],
        Field(description="the files (any field name): image/* or audio/*, or application/pdf for a page model"),
    ]
    input: NotRequired[Annotated[list[str], Field(description="text inputs, embedded in form order with the files")]]
    modality: NotRequired[Literal["image", "audio"]]
    output: NotRequired[Literal["dense", "multivector"]]
    encoding_format: NotRequired[Literal["float", "base64"]]
    dimensions: NotRequired[int]
    prompt_name: NotRequired[Annotated[str, Field(description="a prompt of the model's put before the texts")]]
    task: NotRequired[Annotated[str, Field(description="the task adapter (jina-embeddings-v3, -v4); `adapter` alike")]]
    adapter: NotRequired[str]


class ImageRerankUpload(TypedDict):
    """multipart/form-data of the image rerank upload route: a text query and the files."""

    model: str
    query: str
    file: Annotated[list[bytes], Field(description="the images (any field name); results name them by file name")]
    top_n: NotRequired[int]
