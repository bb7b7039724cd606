"""Files, jobs and each line's result in one SQLite database (the standard library's, WAL mode).

Every method is synchronous and runs on the store's one thread (`Store.call` from the event
loop), so the connection is never shared between threads and writes are serialised. A line's
result and its job's counts change in one transaction: a line counts as done exactly when its
result is stored, and a result stored once is never replaced. With `synchronous=NORMAL` a commit
survives the process being killed (the WAL is in the page cache); a power loss may take the last
commits, which then run again.

The store owns the disk budget (`server.batch_max_disk_bytes`): the files' bytes plus, for each
job, the bytes its stored results will take in its output and error files (`result_bytes`, kept
with the results in the same transaction), so an upload, a new job and a running job's next line
all see the same total.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from infinity_server.errors import HTTPError

T = TypeVar("T")
P = ParamSpec("P")

#: A job's states, as OpenAI names them; the last four are final.
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
FINAL = ("completed", "failed", "cancelled", "expired")
_ACTIVE_SQL = "(" + ", ".join(f"'{status}'" for status in ACTIVE) + ")"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
    bytes INTEGER NOT NULL, lines INTEGER NOT NULL, created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, input_file_id TEXT NOT NULL, endpoint TEXT NOT NULL,
    completion_window TEXT NOT NULL, status TEXT NOT NULL, created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL, in_progress_at INTEGER, finalizing_at INTEGER, completed_at INTEGER,
    failed_at INTEGER, cancelling_at INTEGER, cancelled_at INTEGER, output_file_id TEXT,
    error_file_id TEXT, total INTEGER NOT NULL, completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0, metadata TEXT, error TEXT, result_bytes INTEGER NOT NULL DEFAULT 0,
    error_code TEXT);
CREATE TABLE IF NOT EXISTS results (
    job_id TEXT NOT NULL, line INTEGER NOT NULL, custom_id TEXT, status INTEGER NOT NULL,
    body BLOB NOT NULL, PRIMARY KEY (job_id, line)) WITHOUT ROWID;
"""
#: Columns of `jobs` added after its first release, added to a database made before them.
_ADDED_COLUMNS = {"result_bytes": "INTEGER NOT NULL DEFAULT 0", "error_code": "TEXT"}


@dataclass(frozen=True)
class FileRecord:
    """An uploaded file or a job's output or error file; its bytes are `files/<id>.jsonl`."""

    id: str
    owner: str
    purpose: str
    filename: str
    bytes: int
    lines: int
    created_at: int


@dataclass(frozen=True)
class JobRecord:
    """One batch job: its state, its timestamps and its counts of finished lines."""

    id: str
    owner: str
    input_file_id: str
    endpoint: str
    completion_window: str
    status: str
    created_at: int
    expires_at: int
    in_progress_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    output_file_id: str | None
    error_file_id: str | None
    total: int
    completed: int
    failed: int
    metadata: str | None
    error: str | None
    #: The bytes its stored results will take in its output and error files (0 once written).
    result_bytes: int = 0
    #: The `errors` entry's code when it failed; None for the generic `batch_failed`.
    error_code: str | None = None


@dataclass(frozen=True)
class LineResult:
    """A finished line: its number in the input file, its answer's status and raw JSON body."""

    line: int
    custom_id: str | None
    status: int
    body: bytes


class StorageFull(Exception):
    """A line's result would take the batch files past the disk budget: it is not stored."""

    def __init__(self, line: int, size: int, used: int, budget: int) -> None:
        super().__init__(
            f"line {line}'s result needs {size:,} bytes, but {used:,} of the {budget:,} bytes that batch files may "
            "take (server.batch_max_disk_bytes) are in use"
        )
        self.line, self.size, self.used, self.budget = line, size, used, budget


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def not_found(kind: str, ident: str) -> HTTPError:
    return HTTPError(404, f"no {kind} '{ident}'", code="not_found", param=kind)


class Store:
    """The database of one `batch_dir`, whose files and results may take `disk_budget` bytes;
    open it with `Store.open`, use it through `call`."""

    def __init__(self, connection: sqlite3.Connection, pool: ThreadPoolExecutor, disk_budget: int) -> None:
        self._db, self._pool, self.disk_budget = connection, pool, disk_budget
        #: Bytes held for uploads being read (`reserve`), counted as used until they are recorded.
        self.reserved = 0

    @classmethod
    def open(cls, path: Path, disk_budget: int) -> Store:
        """Open (or create) the database at `path` on the store's thread."""
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-store")
        return cls(pool.submit(_connect, path).result(), pool, disk_budget)

    async def call(self, method: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `method(*args, **kwargs)` (one of this store's) on its thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(method, *args, **kwargs))

    def close(self) -> None:
        self._pool.submit(self._db.close).result()
        self._pool.shutdown()

    # ---- files ------------------------------------------------------------------------------

    def reserve(self, size: int) -> None:
        """Hold `size` bytes of the disk budget for an upload before any of its bytes is read; 413
        when they do not fit beside what is stored and held for other uploads."""
        self._check_room(size, f"this upload may take {size:,}")
        self.reserved += size

    def release(self, size: int) -> None:
        self.reserved -= size

    def add_file(self, record: FileRecord, reserved: int = 0) -> None:
        """Record an uploaded file whose bytes are in place, of which `reserved` bytes are held for
        it already; 413 when it does not fit in the disk budget (the caller then removes the bytes)."""
        self._check_room(record.bytes - reserved, f"this file has {record.bytes:,}")
        with self._db:
            self._db.execute("INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?)", _row(record))

    def disk_used(self) -> int:
        """The files' bytes, and the bytes the results held for jobs not yet written will take."""
        files = "SELECT COALESCE(SUM(bytes), 0) FROM files"
        results = "SELECT COALESCE(SUM(result_bytes), 0) FROM jobs"
        return int(self._db.execute(f"SELECT ({files}) + ({results})").fetchone()[0])

    def _check_room(self, size: int, what: str) -> None:
        used = self.disk_used() + self.reserved
        if used + size > self.disk_budget:
            raise HTTPError(
                413,
                f"batch storage is full: {used:,} of {self.disk_budget:,} bytes (server.batch_max_disk_bytes) are in "
                f"use and {what}; delete files you do not need (DELETE /v1/files/{{id}})",
                code="storage_full",
            )

    def file(self, owner: str, ident: str) -> FileRecord:
        row = self._db.execute("SELECT * FROM files WHERE id = ? AND owner = ?", (ident, owner)).fetchone()
        if row is None:
            raise not_found("file", ident)
        return FileRecord(**row)

    def files(self, owner: str, after: str | None, limit: int, purpose: str | None) -> list[FileRecord]:
        query = "SELECT * FROM files WHERE owner = ? AND (? IS NULL OR purpose = ?)"
        rows = self._page(query, (owner, purpose, purpose), "files", after, limit)
        return [FileRecord(**row) for row in rows]

    def delete_file(self, owner: str, ident: str) -> None:
        self.file(owner, ident)
        busy = self._db.execute(
            f"SELECT id FROM jobs WHERE input_file_id = ? AND status IN {_ACTIVE_SQL}", (ident,)
        ).fetchone()
        if busy is not None:
            raise HTTPError(
                409, f"file '{ident}' is the input of batch '{busy[0]}', which is running", code="file_in_use"
            )
        with self._db:
            self._db.execute("DELETE FROM files WHERE id = ?", (ident,))

    def file_ids(self) -> set[str]:
        return {row[0] for row in self._db.execute("SELECT id FROM files")}

    # ---- jobs -------------------------------------------------------------------------------

    def add_job(self, record: JobRecord, max_active: int, least_bytes: int) -> None:
        """Record a new job; 429 when its owner has `max_active` jobs not yet finished, 413 when
        not even `least_bytes` (the smallest its results can be) fit in the disk budget."""
        active = self._db.execute(
            f"SELECT COUNT(*) FROM jobs WHERE owner = ? AND status IN {_ACTIVE_SQL}", (record.owner,)
        ).fetchone()[0]
        if active >= max_active:
            raise HTTPError(
                429,
                f"this key has {active} batches not yet finished, the most it may have "
                "(server.batch_max_jobs_per_key); wait for one to finish or cancel one",
                code="too_many_batches",
            )
        self._check_room(
            least_bytes, f"the results of this batch's {record.total:,} requests take {least_bytes:,} at least"
        )
        with self._db:
            self._db.execute(f"INSERT INTO jobs VALUES ({', '.join('?' * len(_JOB_FIELDS))})", _row(record))

    def job(self, owner: str | None, ident: str) -> JobRecord:
        """The job `ident`, if `owner` made it (any owner's when None)."""
        row = self._db.execute(
            "SELECT * FROM jobs WHERE id = ? AND (? IS NULL OR owner = ?)", (ident, owner, owner)
        ).fetchone()
        if row is None:
            raise not_found("batch", ident)
        return JobRecord(**row)

    def jobs(self, owner: str, after: str | None, limit: int) -> list[JobRecord]:
        return [
            JobRecord(**row) for row in self._page("SELECT * FROM jobs WHERE owner = ?", (owner,), "jobs", after, limit)
        ]

    def next_job(self, busy: Collection[str] = ()) -> JobRecord | None:
        """The oldest job not yet finished of an owner not in `busy` (owners with a job running)."""
        others = f" AND owner NOT IN ({', '.join('?' * len(busy))})" if busy else ""
        query = f"SELECT * FROM jobs WHERE status IN {_ACTIVE_SQL}{others} ORDER BY rowid LIMIT 1"
        row = self._db.execute(query, tuple(busy)).fetchone()
        return None if row is None else JobRecord(**row)

    def set_status(self, ident: str, status: str, *, only_from: tuple[str, ...] = ACTIVE, **fields: Any) -> JobRecord:
        """Move job `ident` to `status` (stamping `<status>_at`) if it is in one of `only_from`."""
        stamp = f"{status}_at"
        values = {**fields, stamp: int(time.time())} if stamp in JobRecord.__dataclass_fields__ else fields
        assignments = ", ".join(["status = ?", *(f"{name} = ?" for name in values)])
        with self._db:
            self._db.execute(
                f"UPDATE jobs SET {assignments} WHERE id = ? AND status IN ({', '.join('?' * len(only_from))})",
                (status, *values.values(), ident, *only_from),
            )
        return self.job(None, ident)

    def cancel(self, owner: str, ident: str) -> JobRecord:
        """Cancel job `ident`: at once if it has not started, else `cancelling` until its lines in
        flight are dropped; 409 once it is over. One step, so the runner cannot start it meanwhile."""
        job = self.job(owner, ident)
        if job.status in FINAL:
            raise HTTPError(409, f"batch '{ident}' is {job.status} already", code="batch_finished", param="batch_id")
        if job.status == "validating":
            self.set_status(ident, "cancelling", only_from=("validating",))
            return self.set_status(ident, "cancelled", only_from=("cancelling",))
        return self.set_status(ident, "cancelling", only_from=("in_progress",))

    def counts_by_status(self) -> dict[str, int]:
        return dict(self._db.execute("SELECT status, COUNT(*) FROM jobs GROUP BY status").fetchall())

    # ---- results ----------------------------------------------------------------------------

    def record(self, ident: str, result: LineResult, size: int) -> bool:
        """Store a line's result, which takes `size` bytes in a result file, and count it, in one
        transaction; False if it was stored before. `StorageFull` (nothing stored) when it does not
        fit in the disk budget."""
        column = "completed" if 200 <= result.status < 300 else "failed"
        with self._db:
            stored = self._db.execute(
                "SELECT 1 FROM results WHERE job_id = ? AND line = ?", (ident, result.line)
            ).fetchone()
            if stored is not None:
                return False
            used = self.disk_used() + self.reserved
            if used + size > self.disk_budget:
                raise StorageFull(result.line, size, used, self.disk_budget)
            self._db.execute(
                "INSERT INTO results VALUES (?, ?, ?, ?, ?)",
                (ident, result.line, result.custom_id, result.status, result.body),
            )
            self._db.execute(
                f"UPDATE jobs SET {column} = {column} + 1, result_bytes = result_bytes + ? WHERE id = ?", (size, ident)
            )
        return True

    def done_lines(self, ident: str) -> set[int]:
        return {row[0] for row in self._db.execute("SELECT line FROM results WHERE job_id = ?", (ident,))}

    def results(self, ident: str, *, succeeded: bool) -> Iterator[LineResult]:
        """The job's stored results that succeeded (2xx), or the others, in input order."""
        cursor = self._db.execute(
            "SELECT line, custom_id, status, body FROM results WHERE job_id = ? "
            "AND (status BETWEEN 200 AND 299) = ? ORDER BY line",
            (ident, succeeded),
        )
        for line, custom_id, status, body in cursor:
            yield LineResult(line, custom_id, status, bytes(body))

    def halt(self, ident: str, code: str, message: str) -> JobRecord:
        """Stop a running job for good: `finalizing`, with the error that `finish` ends it on (kept
        in the database, so a restart before the files are written still ends it `failed`)."""
        return self.set_status(
            ident, "finalizing", only_from=("in_progress", "cancelling"), error=message, error_code=code
        )

    def fail(self, ident: str, message: str) -> JobRecord:
        """End a job that cannot go on: `failed` with `message`, its stored results dropped."""
        with self._db:
            self._db.execute("DELETE FROM results WHERE job_id = ?", (ident,))
            self._db.execute(
                f"UPDATE jobs SET status = 'failed', failed_at = ?, error = ?, result_bytes = 0 "
                f"WHERE id = ? AND status IN {_ACTIVE_SQL}",
                (int(time.time()), message, ident),
            )
        return self.job(None, ident)

    def finish(self, ident: str, outputs: dict[str, FileRecord | None]) -> JobRecord:
        """Record the job's output and error files, drop its results, and end it in one
        transaction: `failed` if it was halted with an error, `cancelled` if it was cancelling,
        else `completed`. The files' bytes replace its `result_bytes` in the disk budget."""
        job = self.job(None, ident)
        status = "failed" if job.error is not None else "cancelled" if job.status == "cancelling" else "completed"
        stamp = int(time.time())
        files = [record for record in outputs.values() if record is not None]
        ids = {name: None if record is None else record.id for name, record in outputs.items()}
        with self._db:
            self._db.executemany("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?, ?)", map(_row, files))
            self._db.execute("DELETE FROM results WHERE job_id = ?", (ident,))
            self._db.execute(
                f"UPDATE jobs SET status = ?, {status}_at = ?, output_file_id = ?, error_file_id = ?, result_bytes = 0 "
                "WHERE id = ? AND status IN ('finalizing', 'cancelling')",
                (status, stamp, ids["output_file_id"], ids["error_file_id"], ident),
            )
        return self.job(None, ident)

    def _page(self, query: str, args: tuple[Any, ...], table: str, after: str | None, limit: int) -> list[Any]:
        """Newest first, from just after the row `after` (a cursor, as OpenAI's lists take)."""
        cursor = f" AND rowid < (SELECT rowid FROM {table} WHERE id = ?)" if after else ""
        return self._db.execute(
            f"{query}{cursor} ORDER BY rowid DESC LIMIT ?", (*args, *((after,) if after else ()), limit)
        ).fetchall()


def _connect(path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    connection.row_factory = sqlite3.Row
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    connection.executescript(_SCHEMA)
    present = {row["name"] for row in connection.execute("PRAGMA table_info(jobs)")}
    for name, declaration in _ADDED_COLUMNS.items():
        if name not in present:
            connection.execute(f"ALTER TABLE jobs ADD COLUMN {name} {declaration}")
    connection.isolation_level = "DEFERRED"  # `with connection:` commits or rolls back a transaction
    return connection


_JOB_FIELDS = tuple(JobRecord.__dataclass_fields__)


def _row(record: FileRecord | JobRecord) -> tuple[Any, ...]:
    return tuple(getattr(record, name) for name in type(record).__dataclass_fields__)
