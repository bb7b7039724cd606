"""The background runner: jobs oldest first, a few at once but one per key, a few lines of each at once.

A line counts as done when its result is stored (`Store.record`); a job resumed after a restart
skips every line whose result is stored and runs the others, so no line is lost and none is
answered twice. A line refused for load (429) waits as told (else a doubling back-off) and runs
again, up to `OVERLOADED_RETRIES` times; one that met a model unavailable or a deadline (503,
504) runs again a few times before its answer stands.

A line whose result would take the batch files past `server.batch_max_disk_bytes` is not stored:
its job stops there (its lines in flight dropped), writes the result files of the lines stored,
which fit in the budget, and ends `failed` with a `storage_full` error.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import logging
from collections.abc import AsyncGenerator, Callable, Generator

from prometheus_client import CollectorRegistry, Counter, Gauge

from infinity_server.batches.files import Folder
from infinity_server.batches.lines import Dispatch, Line, line_id, output_line, parse
from infinity_server.batches.store import ACTIVE, FINAL, FileRecord, JobRecord, LineResult, StorageFull, Store

log = logging.getLogger(__name__)

#: Whether the pinned models have loaded (or failed to): the runner starts after.
Settled = Callable[[], bool]
#: Tries of a line answered 503 or 504 before that answer stands.
RETRIES = 4
#: Tries of a line refused for load (429) before that answer stands: with the back-off's 30 s
#: between the later ones, about an hour of a server too busy for it.
OVERLOADED_RETRIES = 128
_CHUNK_LINES = 64


class BatchMetrics:
    """`infinity_batch_jobs{status}` and `infinity_batch_job_lines_total{outcome}`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.jobs = Gauge("infinity_batch_jobs", "Batch jobs by status", ["status"], registry=registry)
        self.lines = Counter(
            "infinity_batch_job_lines", "Lines of batch jobs finished, by outcome", ["outcome"], registry=registry
        )

    async def refresh(self, store: Store) -> None:
        counts = await store.call(store.counts_by_status)
        for status in (*ACTIVE, *FINAL):
            self.jobs.labels(status).set(counts.get(status, 0))

    def line(self, status: int) -> None:
        self.lines.labels("completed" if 200 <= status < 300 else "failed").inc()


class Runner:
    """Runs the store's unfinished jobs until stopped; `wake` on a new job, `cancel` to cancel one."""

    def __init__(
        self,
        store: Store,
        folder: Folder,
        dispatch: Dispatch,
        concurrency: int,
        metrics: BatchMetrics,
        settled: Settled,
    ) -> None:
        self.store, self.folder, self.dispatch, self.metrics = store, folder, dispatch, metrics
        self.concurrency, self.settled = concurrency, settled
        self._wake = asyncio.Event()
        self._cancelled: set[str] = set()
        #: Jobs stopped by a result that did not fit in the disk budget, with that refusal.
        self._full: dict[str, StorageFull] = {}
        self._lines: dict[str, set[asyncio.Future[None]]] = {}
        self._task: asyncio.Task[None] | None = None
        #: Jobs running at once, each of another key (`server.batch_running_jobs`).
        self.running_jobs = 1

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run_jobs())

    async def stop(self) -> None:
        """Stop at once: lines in flight are dropped unstored, and run again at the next start."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def wake(self) -> None:
        self._wake.set()

    def cancel(self, job_id: str) -> None:
        """Stop job `job_id` (already marked `cancelling`): its lines in flight are dropped."""
        self._cancelled.add(job_id)
        self._drop_lines(job_id)
        self._wake.set()

    def _drop_lines(self, job_id: str) -> None:
        """Cancel the job's lines in flight but the one calling (which is ending by itself)."""
        caller = asyncio.current_task()
        for task in self._lines.get(job_id, ()):
            if task is not caller:
                task.cancel()

    async def _run_jobs(self) -> None:
        await self.metrics.refresh(self.store)
        # Pinned models still loading would answer the first lines 503; the registry says so by a flag.
        while not self.settled():  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        running: dict[str, asyncio.Task[None]] = {}  # by owner: one job per key at a time
        try:
            while True:
                self._wake.clear()
                job = None
                if len(running) < self.running_jobs:
                    job = await self.store.call(self.store.next_job, tuple(running))
                if job is None:
                    await self._wake.wait()  # a new job, a cancel, or a running job's end
                    continue
                running[job.owner] = asyncio.ensure_future(self._run_one(job))
                running[job.owner].add_done_callback(functools.partial(self._ended, running, job.owner))
        finally:
            for task in running.values():
                task.cancel()
            await asyncio.gather(*running.values(), return_exceptions=True)

    def _ended(self, running: dict[str, asyncio.Task[None]], owner: str, _: object) -> None:
        running.pop(owner, None)
        self._wake.set()

    async def _run_one(self, job: JobRecord) -> None:
        try:
            await self._run(job)
        except Exception as error:  # a job that cannot go on must not stop the others
            log.exception("batch %s failed", job.id)
            message = f"the server could not run this batch: {type(error).__name__}: {error}"
            await self.store.call(self.store.fail, job.id, message)
        finally:
            self._cancelled.discard(job.id)
            self._full.pop(job.id, None)
        await self.metrics.refresh(self.store)

    async def _run(self, job: JobRecord) -> None:
        if job.status == "validating":
            job = await self.store.call(self.store.set_status, job.id, "in_progress", only_from=("validating",))
            await self.metrics.refresh(self.store)
        if job.status == "in_progress":
            if not self.folder.path(job.input_file_id).is_file():
                message = f"the input file '{job.input_file_id}' is gone from the server's batch_dir"
                await self.store.call(self.store.fail, job.id, message)
                return
            await self._run_lines(job)
            job = await self._lines_ran(job)
            await self.metrics.refresh(self.store)
        if job.status in ("finalizing", "cancelling"):  # else cancelled before it started
            outputs = await self.store.call(self._write_outputs, job.id)
            await self.store.call(self.store.finish, job.id, outputs)

    async def _lines_ran(self, job: JobRecord) -> JobRecord:
        """The job after its lines: `finalizing`, with the disk budget's error if it was halted."""
        full = self._full.pop(job.id, None)
        if full is None:
            return await self.store.call(self.store.set_status, job.id, "finalizing", only_from=("in_progress",))
        message = (
            f"this batch stopped because its results outgrew the storage the batch API may use: {full}. "
            "Its output and error files hold the lines that finished (request_counts); delete files you no "
            "longer need (DELETE /v1/files/{id}) and submit the other lines again, or raise "
            "server.batch_max_disk_bytes"
        )
        return await self.store.call(self.store.halt, job.id, "storage_full", message)

    async def _run_lines(self, job: JobRecord) -> None:
        """Every line of the job whose result is not stored yet, `concurrency` at a time."""
        done = await self.store.call(self.store.done_lines, job.id)
        slots, tasks = asyncio.Semaphore(self.concurrency), self._lines.setdefault(job.id, set())

        def finished(task: asyncio.Future[None]) -> None:
            tasks.discard(task)
            slots.release()

        try:
            async with contextlib.aclosing(_read(self.folder.lines(job.input_file_id, done))) as lines:
                async for number, raw in lines:
                    await slots.acquire()
                    if job.id in self._cancelled or job.id in self._full:
                        break
                    line = asyncio.ensure_future(self._line(job, number, raw))
                    tasks.add(line)
                    line.add_done_callback(finished)
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._lines.pop(job.id, None)
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome

    async def _line(self, job: JobRecord, number: int, raw: bytes) -> None:
        parsed = parse(number, raw, job.endpoint, self.dispatch.endpoints, self.dispatch.max_body)
        result = parsed if isinstance(parsed, LineResult) else await self._answer(job, parsed)
        # Sized as the result files will hold it, so the budget counts exactly what finalising writes.
        size = len(output_line(job.id, result))
        try:
            stored = await self.store.call(self.store.record, job.id, result, size)
        except StorageFull as full:
            self._full.setdefault(job.id, full)
            self._drop_lines(job.id)
            return
        if stored:
            self.metrics.line(result.status)

    async def _answer(self, job: JobRecord, line: Line) -> LineResult:
        failures = refusals = 0
        while True:
            answer = await self.dispatch(line, job.owner, line_id(job.id, line.number))
            overloaded = answer.status == 429 and refusals < OVERLOADED_RETRIES
            if not overloaded and not (answer.status in (503, 504) and failures < RETRIES):
                return LineResult(line.number, line.custom_id, answer.status, answer.body)
            failures += not overloaded
            refusals += overloaded
            backoff = 2.0 ** (refusals - 1) if overloaded else 2.0**failures
            await asyncio.sleep(answer.retry_after or min(30.0, backoff))

    def _write_outputs(self, job_id: str) -> dict[str, FileRecord | None]:
        """The job's output and error files from its stored results (on the store's thread)."""
        job = self.store.job(None, job_id)
        written: dict[str, FileRecord | None] = {}
        for name, succeeded, count in (("output_file_id", True, job.completed), ("error_file_id", False, job.failed)):
            ident = output_file_id(job_id, name)
            results = self.store.results(job_id, succeeded=succeeded)
            written[name] = self.folder.write_results(ident, job.owner, job_id, results) if count else None
        return written


def output_file_id(job_id: str, kind: str) -> str:
    """The id of a job's output or error file: the same however often the job is finalised."""
    return "file-" + hashlib.sha256(f"{job_id}:{kind}".encode()).hexdigest()[:24]


async def _read(source: Generator[tuple[int, bytes], None, None]) -> AsyncGenerator[tuple[int, bytes], None]:
    """The lines of `source`, read on a thread a chunk at a time; `source` is closed at the end."""
    try:
        while chunk := await asyncio.to_thread(lambda: list(itertools.islice(source, _CHUNK_LINES))):
            for line in chunk:
                yield line
    finally:
        source.close()
