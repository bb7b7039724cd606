"""OpenAI's Files and Batch routes: upload a JSONL file of requests, run it as a job, read the
results. Every file and job belongs to the key that made it (by the key's name; with no keys
configured, to everyone alike): another key gets 404, as if it did not exist."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any, BinaryIO

import orjson
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from infinity_server.api.common import json_response, parse_body
from infinity_server.batches import schemas as jobs
from infinity_server.batches.schemas import BatchCreateRequest
from infinity_server.batches.service import Batches, upload_limit
from infinity_server.batches.store import FileRecord, JobRecord, not_found
from infinity_server.body_limit import drop_unread
from infinity_server.errors import HTTPError
from infinity_server.routing import BATCH_ERRORS, MULTIPART, get, operation, post

_FORM_FIELDS = 8
_FIELD_BYTES = 2**16
_CHUNK = 2**20


def batches_of(request: Request) -> Batches:
    batches: Batches = request.app.state.batches
    return batches


def owner_of(request: Request) -> str:
    """The name of the request's key; "" for everyone when no key is configured."""
    return str(request.scope.get("state", {}).get("key_name") or "")


def file_object(record: FileRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "object": "file",
        "bytes": record.bytes,
        "created_at": record.created_at,
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def batch_object(job: JobRecord) -> dict[str, Any]:
    errors = None
    if job.error is not None:
        code = job.error_code or "batch_failed"
        errors = {"object": "list", "data": [{"code": code, "message": job.error, "param": None, "line": None}]}
    return {
        "id": job.id,
        "object": "batch",
        "endpoint": job.endpoint,
        "errors": errors,
        "input_file_id": job.input_file_id,
        "completion_window": job.completion_window,
        "status": job.status,
        "output_file_id": job.output_file_id,
        "error_file_id": job.error_file_id,
        "created_at": job.created_at,
        "in_progress_at": job.in_progress_at,
        "expires_at": job.expires_at,
        "finalizing_at": job.finalizing_at,
        "completed_at": job.completed_at,
        "failed_at": job.failed_at,
        "expired_at": None,
        "cancelling_at": job.cancelling_at,
        "cancelled_at": job.cancelled_at,
        "request_counts": {"total": job.total, "completed": job.completed, "failed": job.failed},
        "metadata": None if job.metadata is None else orjson.loads(job.metadata),
    }


def page(request: Request, default: int, most: int) -> tuple[str | None, int]:
    """The `after` cursor and the `limit` (1 to `most`) of a list request."""
    after, limit = request.query_params.get("after"), request.query_params.get("limit")
    if limit is None:
        return after, default
    return after, whole_number(limit, "limit", 1, most)


def whole_number(text: str, name: str, low: int, high: int) -> int:
    """`text` as a whole number from `low` to `high`, else a 400 naming `name`. ASCII digits only,
    and no more of them than `high` has: `str.isdigit` also passes digits such as '²' that `int`
    refuses, and `int` refuses more than 4,300 digits."""
    digits = text.lstrip("0") or "0"
    if text.isascii() and text.isdigit() and len(digits) <= len(str(high)) and low <= int(digits) <= high:
        return int(digits)
    shown = repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text):,} characters)"
    message = f"{name} must be a whole number from {low} to {high}, got {shown}"
    raise HTTPError(400, message, code=f"invalid_{name}", param=name)


def listing(objects: list[dict[str, Any]], limit: int) -> Response:
    """OpenAI's cursor page of `objects` (one more than `limit` was fetched: whether there are more)."""
    shown = objects[:limit]
    first, last = (shown[0]["id"], shown[-1]["id"]) if shown else (None, None)
    return json_response(
        {"object": "list", "data": shown, "first_id": first, "last_id": last, "has_more": len(objects) > limit}
    )


async def upload_file(request: Request) -> Response:
    """multipart/form-data: `file` (JSONL) and `purpose` (batch)."""
    batches = batches_of(request)
    async with contextlib.AsyncExitStack() as held:
        try:
            batches.running()  # a 404 while the API is off, before the body is read
            reserved = await held.enter_async_context(batches.reservation(upload_size(request)))
        except HTTPError:
            # Refused unread (storage_full): the body is dropped first, so that the connection
            # stays usable for the client's next request instead of closing under it.
            await drop_unread(request)
            raise
        return await _upload(request, batches, reserved)


def upload_size(request: Request) -> int:
    """The most disk an upload may take: its declared length, else the largest upload allowed (the
    body-limit middleware holds a body to either)."""
    declared = request.headers.get("content-length", "")
    largest = upload_limit(request.app.state.settings.server) or 0
    return min(int(declared), largest) if declared.isascii() and declared.isdigit() else largest


async def _upload(request: Request, batches: Batches, reserved: int) -> Response:
    form = await request.form(max_files=1, max_fields=_FORM_FIELDS, max_part_size=_FIELD_BYTES)
    try:
        if form.get("purpose") != "batch":
            message = (
                f"purpose must be 'batch' (the only purpose this server keeps files for), got {form.get('purpose')!r}"
            )
            raise HTTPError(400, message, code="invalid_purpose", param="purpose")
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise HTTPError(
                422, "the form field 'file' (the JSONL file of requests) is required", code="invalid_body", param="file"
            )
        record = await batches.add_file(owner_of(request), upload.file, upload.filename or "batch.jsonl", reserved)
    finally:
        await form.close()
    return json_response(file_object(record))


async def list_files(request: Request) -> Response:
    store, _, _ = batches_of(request).running()
    after, limit = page(request, 100, 10_000)
    purpose = request.query_params.get("purpose")
    records = await store.call(store.files, owner_of(request), after, limit + 1, purpose)
    return listing([file_object(record) for record in records], limit)


async def get_file(request: Request) -> Response:
    store, _, _ = batches_of(request).running()
    return json_response(file_object(await store.call(store.file, owner_of(request), request.path_params["file_id"])))


async def file_content(request: Request) -> Response:
    """The file's bytes, streamed from a handle opened first: a file deleted meanwhile is still
    read whole (or, deleted before the open, is a 404)."""
    store, folder, _ = batches_of(request).running()
    ident = request.path_params["file_id"]
    record = await store.call(store.file, owner_of(request), ident)
    try:
        handle = await asyncio.to_thread(folder.path(record.id).open, "rb")
    except FileNotFoundError:
        raise not_found("file", ident) from None
    size = os.fstat(handle.fileno()).st_size
    return StreamingResponse(_read(handle), media_type="application/jsonl", headers={"content-length": str(size)})


async def _read(handle: BinaryIO) -> AsyncIterator[bytes]:
    try:
        while chunk := await asyncio.to_thread(handle.read, _CHUNK):
            yield chunk
    finally:
        handle.close()


async def delete_file(request: Request) -> Response:
    store, folder, _ = batches_of(request).running()
    ident = request.path_params["file_id"]
    await store.call(store.delete_file, owner_of(request), ident)
    folder.remove(ident)
    return json_response({"id": ident, "object": "file", "deleted": True})


async def create_batch(request: Request) -> Response:
    batches = batches_of(request)
    batches.running()  # a 404 while the API is off, before the body is read
    body = await parse_body(request, BatchCreateRequest)
    return json_response(batch_object(await batches.add_job(owner_of(request), body)))


async def list_batches(request: Request) -> Response:
    store, _, _ = batches_of(request).running()
    after, limit = page(request, 20, 100)
    jobs = await store.call(store.jobs, owner_of(request), after, limit + 1)
    return listing([batch_object(job) for job in jobs], limit)


async def get_batch(request: Request) -> Response:
    store, _, _ = batches_of(request).running()
    return json_response(batch_object(await store.call(store.job, owner_of(request), request.path_params["batch_id"])))


async def cancel_batch(request: Request) -> Response:
    job = await batches_of(request).cancel(owner_of(request), request.path_params["batch_id"])
    return json_response(batch_object(job))


_BATCH = {"errors": BATCH_ERRORS, "tag": "batches"}
operations = [
    post(
        "/v1/files",
        upload_file,
        "Upload a batch's requests (JSONL)",
        request=jobs.FileUpload,
        request_type=MULTIPART,
        response=jobs.FileObject,
        max_body=upload_limit,
        **_BATCH,
    ),
    get("/v1/files", list_files, "The key's files, newest first", response=jobs.FileList, **_BATCH),
    get("/v1/files/{file_id}", get_file, "One file", response=jobs.FileObject, **_BATCH),
    operation("DELETE", "/v1/files/{file_id}", delete_file, "Delete a file", response=jobs.FileDeleted, **_BATCH),
    get(
        "/v1/files/{file_id}/content",
        file_content,
        "A file's bytes (JSONL)",
        response_type="application/jsonl",
        **_BATCH,
    ),
    post(
        "/v1/batches",
        create_batch,
        "Run a file of requests as a job",
        request=jobs.BatchCreateRequest,
        response=jobs.BatchObject,
        **_BATCH,
    ),
    get("/v1/batches", list_batches, "The key's jobs, newest first", response=jobs.BatchList, **_BATCH),
    get(
        "/v1/batches/{batch_id}",
        get_batch,
        "One job: status, counts, result files",
        response=jobs.BatchObject,
        **_BATCH,
    ),
    post("/v1/batches/{batch_id}/cancel", cancel_batch, "Cancel a job", response=jobs.BatchObject, **_BATCH),
]
