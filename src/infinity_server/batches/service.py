"""The batch API's state for one app: off (no `server.batch_dir`), or its store, files and runner.

The lifespan starts it after the registry and stops it before: jobs left unfinished by a stop (or
a crash) resume at the next start from the lines whose results are stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from infinity_server.batches.files import Folder, Limits
from infinity_server.batches.lines import Dispatch, output_line
from infinity_server.batches.runner import BatchMetrics, Runner
from infinity_server.batches.schemas import (
    METADATA_KEY_CHARS,
    METADATA_PAIRS,
    METADATA_VALUE_CHARS,
    BatchCreateRequest,
)
from infinity_server.batches.store import FileRecord, JobRecord, LineResult, Store, new_id
from infinity_server.errors import HTTPError
from infinity_server.settings import ServerSettings
from model_registry.errors import ConfigError

#: Room for the multipart framing and the other fields around an upload's bytes.
_FORM_OVERHEAD = 2**16
#: The one completion window, as OpenAI's API accepts it.
WINDOW_SECONDS = {"24h": 24 * 3600}


class Batches:
    """What the batch routes work with; `started` holds the parts while the app runs."""

    def __init__(self, server: ServerSettings, registry: CollectorRegistry) -> None:
        self.settings = server
        self.metrics = BatchMetrics(registry)
        self._parts: tuple[Store, Folder, Runner] | None = None
        self.endpoints: tuple[str, ...] = ()

    @property
    def on(self) -> bool:
        return self.settings.batch_dir is not None

    async def start(self, app: Starlette) -> None:
        if self.settings.batch_dir is None:
            return
        store, folder = await asyncio.to_thread(_open, self.settings.batch_dir, self.settings.batch_max_disk_bytes)
        registry = app.state.registry
        concurrency = self.settings.batch_concurrency
        dispatch = Dispatch(app)
        self.endpoints = dispatch.endpoints
        runner = Runner(store, folder, dispatch, concurrency, self.metrics, lambda: registry.pinned_tried)
        runner.running_jobs = self.settings.batch_running_jobs
        runner.start()
        self._parts = (store, folder, runner)

    async def stop(self) -> None:
        if self._parts is not None:
            store, _, runner = self._parts
            await runner.stop()
            await asyncio.to_thread(store.close)
            self._parts = None

    def running(self) -> tuple[Store, Folder, Runner]:
        """The running parts; a 404 while the API is off (503 while the app starts or stops)."""
        if not self.on:
            message = "the batch API is off; set server.batch_dir to a folder that persists to turn it on"
            raise HTTPError(404, message, code="batches_disabled")
        if self._parts is None:
            raise HTTPError(503, "the batch API is starting or stopping; retry shortly", code="batches_unavailable")
        return self._parts

    @contextlib.asynccontextmanager
    async def reservation(self, size: int) -> AsyncIterator[int]:
        """`size` bytes of the disk budget held for an upload while it is read and recorded (413
        when they do not fit)."""
        store, _, _ = self.running()
        await store.call(store.reserve, size)
        try:
            yield size
        finally:
            await store.call(store.release, size)

    async def add_file(self, owner: str, source: Any, filename: str, reserved: int = 0) -> FileRecord:
        """Copy an upload in, checked against the limits, and record it (`reserved`: the bytes its
        `reservation` holds)."""
        store, folder, _ = self.running()
        limits = Limits(self.settings.batch_max_file_bytes, self.settings.batch_max_requests)
        record = await asyncio.to_thread(folder.save, source, owner, filename, limits)
        try:
            await store.call(store.add_file, record, reserved)
        except BaseException:
            folder.remove(record.id)
            raise
        return record

    async def add_job(self, owner: str, body: BatchCreateRequest) -> JobRecord:
        """A new job on an uploaded file, checked, recorded and handed to the runner."""
        store, _, runner = self.running()
        if body.endpoint not in self.endpoints:
            message = f"endpoint {body.endpoint!r} is not one a batch runs; accepted: {', '.join(self.endpoints)}"
            raise HTTPError(400, message, code="invalid_endpoint", param="endpoint")
        if body.completion_window not in WINDOW_SECONDS:
            message = f"completion_window must be {' or '.join(WINDOW_SECONDS)}, got {body.completion_window!r}"
            raise HTTPError(400, message, code="invalid_completion_window", param="completion_window")
        if body.metadata is not None:
            _check_metadata(body.metadata)
        source = await store.call(store.file, owner, body.input_file_id)
        _check_input(source, self.settings.batch_max_requests)
        now = int(time.time())
        metadata = None if body.metadata is None else orjson.dumps(body.metadata).decode()
        job = JobRecord(
            new_id("batch_"), owner, source.id, body.endpoint, body.completion_window, "validating", now,
            now + WINDOW_SECONDS[body.completion_window], None, None, None, None, None, None, None, None,
            source.lines, 0, 0, metadata, None,
        )  # fmt: skip
        least = source.lines * least_result_bytes(job.id)
        await store.call(store.add_job, job, self.settings.batch_max_jobs_per_key, least)
        runner.wake()
        await self.metrics.refresh(store)
        return job

    async def cancel(self, owner: str, ident: str) -> JobRecord:
        store, _, runner = self.running()
        job = await store.call(store.cancel, owner, ident)
        if job.status == "cancelling":
            runner.cancel(ident)
        await self.metrics.refresh(store)
        return job


def upload_limit(server: ServerSettings) -> int | None:
    """The file upload's body limit, which replaces `server.max_body_bytes` while the API is on."""
    return server.batch_max_file_bytes + _FORM_OVERHEAD if server.batch_dir is not None else None


def least_result_bytes(job_id: str) -> int:
    """The fewest bytes one line's result can take in a result file: a one-character custom_id
    and an empty answer (every answer and every failure's line is longer)."""
    return len(output_line(job_id, LineResult(1, "x", 200, b"{}")))


def _open(batch_dir: str, disk_budget: int) -> tuple[Store, Folder]:
    """The database and the files of `batch_dir`, created if new; bytes never recorded dropped."""
    root = Path(batch_dir).expanduser()
    try:
        root.mkdir(parents=True, exist_ok=True)
        store, folder = Store.open(root / "batches.sqlite3", disk_budget), Folder(root)
    except (OSError, sqlite3.Error) as error:
        raise ConfigError(f"server.batch_dir '{root}' cannot hold the batch database and files: {error}") from None
    folder.remove_strays(store.file_ids())
    return store, folder


def _check_input(source: FileRecord, max_requests: int) -> None:
    if source.purpose != "batch":
        message = f"file '{source.id}' is a batch's output; upload the requests with purpose 'batch'"
        raise HTTPError(400, message, code="invalid_input_file", param="input_file_id")
    if source.lines > max_requests:
        message = (
            f"file '{source.id}' holds {source.lines:,} requests, over server.batch_max_requests ({max_requests:,})"
        )
        raise HTTPError(400, message, code="too_many_requests", param="input_file_id")


def _check_metadata(metadata: dict[str, str]) -> None:
    """OpenAI's limits: a 400 naming `metadata`. Each job's metadata is in every list of jobs, so
    these also bound what a list answers."""
    problem = _metadata_problem(metadata)
    if problem is not None:
        message = (
            f"metadata {problem} (OpenAI's limits: {METADATA_PAIRS} pairs, keys up to {METADATA_KEY_CHARS} "
            f"characters, values up to {METADATA_VALUE_CHARS})"
        )
        raise HTTPError(400, message, code="invalid_metadata", param="metadata")


def _metadata_problem(metadata: dict[str, str]) -> str | None:
    if len(metadata) > METADATA_PAIRS:
        return f"holds {len(metadata)} key-value pairs"
    for key, value in metadata.items():
        if len(key) > METADATA_KEY_CHARS:
            return f"key {key[:METADATA_KEY_CHARS]!r}... has {len(key):,} characters"
        if len(value) > METADATA_VALUE_CHARS:
            return f"value of key {key!r} has {len(value):,} characters"
    return None
