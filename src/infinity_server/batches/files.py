"""The files' bytes on disk, `<batch_dir>/files/<id>.jsonl`: uploads checked as they are copied
in, output and error files written whole before they are recorded. Blocking: run on a thread."""

from __future__ import annotations

import os
import time
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import orjson

from infinity_server.batches.lines import output_line
from infinity_server.batches.store import FileRecord, LineResult, new_id
from infinity_server.errors import HTTPError

_CHUNK = 2**20


@dataclass(frozen=True)
class Limits:
    """What one upload may hold."""

    max_bytes: int
    max_lines: int


class Folder:
    """The files of one `batch_dir`."""

    def __init__(self, root: Path) -> None:
        self.root = root / "files"
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, ident: str) -> Path:
        return self.root / f"{ident}.jsonl"

    def save(self, source: BinaryIO, owner: str, filename: str, limits: Limits) -> FileRecord:
        """Copy an uploaded batch file in and check it: at most `limits`, a `custom_id` once per
        file. A file refused is removed; one accepted is in place (and synced) when this returns."""
        ident = new_id("file-")
        staging = self.root / f"{ident}.upload"
        try:
            size = _copy(source, staging, limits.max_bytes)
            with staging.open("rb") as lines:
                count = _check_lines(lines, limits.max_lines)
            staging.rename(self.path(ident))
        finally:
            staging.unlink(missing_ok=True)
        return FileRecord(ident, owner, "batch", filename, size, count, int(time.time()))

    def write_results(self, ident: str, owner: str, job_id: str, results: Iterable[LineResult]) -> FileRecord:
        """The output (or error) file `ident` of job `job_id`, written whole, then renamed in place."""
        staging = self.root / f"{ident}.partial"
        count = 0
        with staging.open("wb") as sink:
            for result in results:
                sink.write(output_line(job_id, result))
                count += 1
            sink.flush()
            os.fsync(sink.fileno())
        staging.replace(self.path(ident))
        size, name = self.path(ident).stat().st_size, f"{job_id}_{ident}.jsonl"
        return FileRecord(ident, owner, "batch_output", name, size, count, int(time.time()))

    def lines(self, ident: str, skip: set[int]) -> Generator[tuple[int, bytes], None, None]:
        """The non-blank lines of file `ident` with their numbers (from 1), but those in `skip`."""
        with self.path(ident).open("rb") as source:
            for number, raw in enumerate(source, start=1):
                if number not in skip and raw.strip():
                    yield number, raw

    def remove_strays(self, known: set[str]) -> None:
        """Drop the bytes of files never recorded (a process killed between writing and recording)."""
        for path in self.root.iterdir():
            if path.name.partition(".")[0] not in known:
                path.unlink(missing_ok=True)

    def remove(self, ident: str) -> None:
        self.path(ident).unlink(missing_ok=True)


def _copy(source: BinaryIO, target: Path, limit: int) -> int:
    size = 0
    with target.open("wb") as sink:
        while chunk := source.read(_CHUNK):
            size += len(chunk)
            if size > limit:
                raise HTTPError(
                    413,
                    f"the file is larger than {limit:,} bytes (server.batch_max_file_bytes); split it into several",
                    code="file_too_large",
                    param="file",
                )
            sink.write(chunk)
        sink.flush()
        os.fsync(sink.fileno())
    return size


def _check_lines(lines: BinaryIO, limit: int) -> int:
    """The count of non-blank lines; a 400 for too many, or for a custom_id given twice. Lines
    that are not requests are left for the job to fail one by one."""
    seen: dict[str, int] = {}
    count = 0
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        count += 1
        if count > limit:
            message = f"the file holds more than {limit:,} requests (server.batch_max_requests); split it into several"
            raise HTTPError(400, message, code="too_many_requests", param="file")
        custom_id = _custom_id(raw)
        if custom_id is not None and seen.setdefault(custom_id, number) != number:
            message = (
                f"custom_id {custom_id!r} is on line {seen[custom_id]} and line {number}; each request needs its own"
            )
            raise HTTPError(400, message, code="duplicate_custom_id", param="file")
    if count == 0:
        raise HTTPError(400, "the file holds no requests (one JSON object per line)", code="empty_file", param="file")
    return count


def _custom_id(raw: bytes) -> str | None:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    custom_id = data.get("custom_id") if isinstance(data, dict) else None
    return custom_id if isinstance(custom_id, str) else None
