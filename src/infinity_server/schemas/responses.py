"""Wire models of the responses, for the API document (`infinity_server/openapi.py`).

The routes write their JSON directly (orjson, numpy arrays as they are); these models describe
what they write, and the schemathesis run checks every answer against them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

#: A vector as floats, as int8/uint8/binary codes, or base64 of its bytes.
Vector = list[float] | list[int] | str


class ErrorDetail(BaseModel):
    message: str
    type: Literal[
        "invalid_request_error", "authentication_error", "permission_error", "rate_limit_error", "server_error"
    ]
    param: str | None
    code: str = Field(description="a stable, machine-readable name of the error, e.g. model_not_found")


class ErrorResponse(BaseModel):
    """Every error of every route, in OpenAI's shape."""

    error: ErrorDetail


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingData(BaseModel):
    object: Literal["embedding"]
    embedding: Vector | list[list[float]] = Field(description="the vector (a matrix for multi-vector output)")
    index: int
    shape: list[int] | None = Field(default=None, description="multi-vector output only: [tokens, width]")


class EmbeddingResponse(BaseModel):
    object: Literal["list"]
    data: list[EmbeddingData]
    model: str
    usage: Usage


class ModelStats(BaseModel):
    """Infinity's `stats` object (its client requires one): the model's queue."""

    queue_depth: int
    queue_tokens: int


class ModelEntry(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: Literal["infinity"] = Field(description="Infinity's value, which infinity_client requires")
    kind: str
    capabilities: list[str]
    backend: str
    device: str
    dtype: str
    status: str = Field(description="unloaded, loading, loaded or failed")
    pinned: bool
    max_length: int | None
    dimensions: int | None
    footprint_bytes: int | None
    last_used: float | None
    queue_depth: int
    stats: ModelStats
    error: str | None
    details: dict[str, Any] | None = None


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelEntry]


class RerankResult(BaseModel):
    relevance_score: float | None
    index: int
    document: str | None = None
    #: A hybrid rerank with `return_parts`: each output's score (dense, sparse, multivector).
    parts: dict[str, float] | None = None


class RerankResponse(BaseModel):
    """Infinity's `/rerank`."""

    object: Literal["rerank"]
    id: str
    created: int
    model: str
    results: list[RerankResult]
    usage: Usage
    meta: dict[str, Any]


class ImageRerankResponse(BaseModel):
    """`/v1/rerank/images` and its upload twin."""

    object: Literal["rerank"]
    results: list[RerankResult]
    model: str
    usage: Usage


class ClassLabel(BaseModel):
    label: str
    score: float


class ClassifyResponse(BaseModel):
    object: Literal["classify"]
    id: str
    created: int
    model: str
    data: list[list[ClassLabel]]
    usage: Usage


class CohereDocument(BaseModel):
    text: str


class CohereResult(BaseModel):
    index: int
    relevance_score: float | None
    document: CohereDocument | None = None


class CohereRerankResponse(BaseModel):
    id: str
    results: list[CohereResult]
    meta: dict[str, Any]


class SparseEntry(BaseModel):
    indices: list[int]
    values: list[float]
    tokens: list[str] | None = None


class MultivectorBase64(BaseModel):
    data: str
    shape: list[int]
    dtype: str


class Encoding(BaseModel):
    object: Literal["encoding"]
    index: int
    dense: Vector | None = None
    sparse: SparseEntry | None = None
    multivector: list[Vector] | MultivectorBase64 | None = None


class EncodeResponse(BaseModel):
    object: Literal["list"]
    model: str
    data: list[Encoding]
    usage: Usage


class Health(BaseModel):
    unix: float


class Readiness(BaseModel):
    ready: bool
    pinned: dict[str, str] | None = Field(default=None, description="each pinned model's state")
    draining: bool | None = Field(default=None, description="true while the server shuts down")
    loading_seconds: dict[str, float] | None = Field(
        default=None, description="pinned models loading now, with how long each load has run"
    )
    errors: dict[str, str] | None = Field(
        default=None, description="why a pinned model failed to load (it is retried on its back-off)"
    )


class DeviceMemory(BaseModel):
    device: str
    budget_bytes: int
    charged_bytes: int


class LifecycleEventEntry(BaseModel):
    kind: str
    model: str
    device: str
    bytes: int
    at: float
    seconds: float
    reason: str | None
    candidates: list[dict[str, Any]]


class MemoryResponse(BaseModel):
    devices: list[DeviceMemory]
    events: list[LifecycleEventEntry]


class EmbeddingUpload(BaseModel):
    """multipart/form-data of `POST /v1/embeddings/upload`: the files, in order, and options."""

    model: str
    file: list[bytes] = Field(description="the files (any field name); image/* or audio/* content types")
    input: list[str] | None = Field(default=None, description="text inputs, embedded in form order with the files")
    modality: Literal["image", "audio"] | None = None
    output: Literal["dense", "multivector"] = "dense"
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None


class ImageRerankUpload(BaseModel):
    """multipart/form-data of `POST /v1/rerank/images/upload`: a text query and the files."""

    model: str
    query: str
    file: list[bytes] = Field(description="the images (any field name); results name them by file name")
    top_n: int | None = None
