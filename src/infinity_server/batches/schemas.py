"""Wire models of the batch routes, in OpenAI's shapes: the request a job is made from, and the
file, job and list objects the routes write (for the API document)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, StrictStr

from infinity_server.schemas.common import NAME_CHARS, Body, Name

#: OpenAI's limits on a batch's metadata: pairs, and characters of a key and of a value.
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512

JobStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]


class BatchCreateRequest(Body):
    """`POST /v1/batches`: the uploaded file of requests and the route every line goes to."""

    input_file_id: Name
    endpoint: StrictStr = Field(
        max_length=NAME_CHARS,
        description="the route each line runs: OpenAI's or Infinity's embeddings, rerank, encode or classify",
    )
    completion_window: StrictStr = Field(max_length=NAME_CHARS, description="24h, the only window accepted")
    # The limits are checked by the service (a 400 in OpenAI's shape, as OpenAI answers), not here
    # (a 422); they are declared for the API document.
    metadata: dict[StrictStr, StrictStr] | None = Field(
        default=None,
        description=f"up to {METADATA_PAIRS} pairs: keys up to {METADATA_KEY_CHARS} characters, values up to "
        f"{METADATA_VALUE_CHARS}",
        json_schema_extra={
            "maxProperties": METADATA_PAIRS,
            "propertyNames": {"maxLength": METADATA_KEY_CHARS},
            "additionalProperties": {"type": "string", "maxLength": METADATA_VALUE_CHARS},
        },
    )


class FileUpload(BaseModel):
    """multipart/form-data of `POST /v1/files`."""

    file: bytes = Field(description="JSONL: one request per line, {custom_id, method, url, body}")
    purpose: Literal["batch"]


class FileObject(BaseModel):
    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    filename: str
    purpose: Literal["batch", "batch_output"]
    status: Literal["processed"]
    expires_at: int | None
    status_details: str | None


class FileList(BaseModel):
    object: Literal["list"]
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"]
    deleted: bool


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class JobError(BaseModel):
    code: str
    message: str
    param: str | None
    line: int | None


class JobErrors(BaseModel):
    object: Literal["list"]
    data: list[JobError]


class BatchObject(BaseModel):
    id: str
    object: Literal["batch"]
    endpoint: str
    errors: JobErrors | None
    input_file_id: str
    completion_window: str
    status: JobStatus
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None


class BatchList(BaseModel):
    object: Literal["list"]
    data: list[BatchObject]
    first_id: str | None
    last_id: str | None
    has_more: bool
