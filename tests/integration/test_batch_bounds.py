"""The batch API's bounds over real HTTP: a job's results count against `batch_max_disk_bytes` while
it runs (and stop it when they would not fit), metadata has OpenAI's limits, and a list's `limit`
is a whole number in its range, whatever characters it is sent as."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.integration.test_batches import DONE, FAKE, SLOW, embed_lines, jsonl, line, refusal, upload
from tests.waiting import eventually

pytestmark = pytest.mark.integration


def wait(
    http: httpx.Client, batch_id: str, until: Callable[[dict[str, Any]], bool], limit: float = 30
) -> dict[str, Any]:
    """The job once `until(job)` holds (polled); fails after `limit` seconds."""

    def job() -> dict[str, Any]:
        found: dict[str, Any] = http.get(f"/v1/batches/{batch_id}").json()
        return found

    return eventually(job, until, deadline=limit)


def start(http: httpx.Client, rows: list[Any], **extra: Any) -> dict[str, Any]:
    uploaded = upload(http, jsonl(rows))
    assert uploaded.status_code == 200, uploaded.text
    job = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"}
    created = http.post("/v1/batches", json=job | extra)
    assert created.status_code == 200, created.text
    return dict(created.json())


def files_bytes(http: httpx.Client) -> int:
    return sum(int(record["bytes"]) for record in http.get("/v1/files").json()["data"])


def test_a_job_whose_results_would_pass_the_disk_budget_stops_failed_within_it(serve: Any, tmp_path: Path) -> None:
    budget = 40_000
    server = serve({"models": [FAKE]}, batch_dir=str(tmp_path), batch_max_disk_bytes=budget, access_log=False)
    # Each line embeds 32 texts: a ~3 KB answer from a ~250-byte request, so 60 lines outgrow the budget.
    rows = [line(f"req-{i}", {"model": "fake", "input": ["a"] * 32}) for i in range(60)]
    with server.client() as http:
        batch = wait(http, start(http, rows)["id"], lambda job: job["status"] in DONE)
        assert batch["status"] == "failed", batch
        (error,) = batch["errors"]["data"]
        assert error["code"] == "storage_full"
        assert "server.batch_max_disk_bytes" in error["message"]
        counts = batch["request_counts"]
        assert 0 < counts["completed"] < counts["total"] == 60
        assert counts["failed"] == 0
        output = http.get(f"/v1/files/{batch['output_file_id']}/content").content.splitlines()
        assert len(output) == counts["completed"]  # what finished is kept, each line once
        assert files_bytes(http) <= budget
        assert sum(path.stat().st_size for path in (tmp_path / "files").iterdir()) <= budget

        # Deleting the output file gives its space back.
        assert http.delete(f"/v1/files/{batch['output_file_id']}").status_code == 200
        assert files_bytes(http) == http.get(f"/v1/files/{batch['input_file_id']}").json()["bytes"]


def test_a_job_whose_results_cannot_fit_is_refused_at_creation(serve: Any, tmp_path: Path) -> None:
    # The upload's body (~2.2 KB with its multipart framing) is held while it is read, then its file.
    server = serve({"models": [FAKE]}, batch_dir=str(tmp_path), batch_max_disk_bytes=2400, access_log=False)
    rows = [line(f"s{i}", {"model": "fake", "input": "a"}) for i in range(20)]  # ~1.9 KB
    with server.client() as http:
        uploaded = upload(http, jsonl(rows))
        assert uploaded.status_code == 200, uploaded.text
        job = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"}
        # Every result line is over 100 bytes: 20 of them cannot fit in the ~500 bytes left.
        message = refusal(http.post("/v1/batches", json=job), 413, "storage_full")
        assert "batch_max_disk_bytes" in message
        assert "20 requests" in message
        assert http.get("/v1/batches").json()["data"] == []


def test_a_running_jobs_results_are_counted_for_uploads(serve: Any, tmp_path: Path) -> None:
    budget = 20_000
    settings = {"batch_max_disk_bytes": budget, "batch_concurrency": 1, "access_log": False}
    server = serve({"models": [SLOW]}, batch_dir=str(tmp_path), **settings)
    with server.client() as http:
        batch = start(http, embed_lines(60, "slow"))
        wait(http, batch["id"], lambda job: job["request_counts"]["completed"] >= 5)
        # Fits beside the files, but not beside the five or more results (~230 bytes each) held so far.
        room = budget - files_bytes(http) - 200
        padding = b'{"custom_id": "pad", "x": "' + b"a" * (room - 30) + b'"}\n'
        assert len(padding) == room
        assert "batch_max_disk_bytes" in refusal(upload(http, padding), 413, "storage_full")
        assert http.post(f"/v1/batches/{batch['id']}/cancel").status_code == 200
        cancelled = wait(http, batch["id"], lambda job: job["status"] in DONE)
        assert cancelled["status"] == "cancelled"
        assert files_bytes(http) <= budget


def test_metadata_has_openais_limits(serve: Any, tmp_path: Path) -> None:
    server = serve({"models": [FAKE]}, batch_dir=str(tmp_path), access_log=False)
    with server.client() as http:
        source = upload(http, jsonl(embed_lines(1))).json()["id"]
        job = {"input_file_id": source, "endpoint": "/v1/embeddings", "completion_window": "24h"}
        widest = {f"{i:02d}".ljust(64, "k"): "v" * 512 for i in range(16)}
        created = http.post("/v1/batches", json=job | {"metadata": widest})
        assert created.status_code == 200, created.text
        assert created.json()["metadata"] == widest
        refused = {
            "holds 17 key-value pairs": {f"key-{i}": "v" for i in range(17)},
            "has 65 characters": {"k" * 65: "v"},
            "has 513 characters": {"key": "v" * 513},
            "has 14,000,000 characters": {"key": "v" * 14_000_000},
        }
        for expected, metadata in refused.items():
            answer = http.post("/v1/batches", json=job | {"metadata": metadata})
            message = refusal(answer, 400, "invalid_metadata")
            assert answer.json()["error"]["param"] == "metadata"
            assert expected in message, message
            assert len(message) < 500, "the message must not echo the metadata"
        assert [listed["id"] for listed in http.get("/v1/batches").json()["data"]] == [created.json()["id"]]


def test_a_list_limit_out_of_range_or_not_a_number_is_a_400(serve: Any, tmp_path: Path) -> None:
    server = serve({"models": [FAKE]}, batch_dir=str(tmp_path), access_log=False)
    cases = [
        ("/v1/files", "²", 10_000),
        ("/v1/batches", "9" * 5000, 100),  # more digits than `int` takes
        ("/v1/batches", "٣", 100),  # an Arabic-Indic 3: a digit to `str.isdigit` and to `int`, not to OpenAI
        ("/v1/batches", "101", 100),
        ("/v1/files", "0", 10_000),
        ("/v1/files", "-1", 10_000),
        ("/v1/files", " 5", 10_000),
        ("/v1/files", "", 10_000),
    ]
    with server.client() as http:
        for path, limit, most in cases:
            answer = http.get(path, params={"limit": limit})
            message = refusal(answer, 400, "invalid_limit")
            assert answer.json()["error"]["param"] == "limit"
            assert f"from 1 to {most}" in message, message
            assert len(message) < 200, "the message must not echo a long value whole"
        for path, most in (("/v1/files", 10_000), ("/v1/batches", 100)):
            assert http.get(path, params={"limit": "007"}).status_code == 200
            assert http.get(path, params={"limit": str(most)}).status_code == 200


def test_a_line_larger_than_a_request_body_fails_alone_with_413(serve: Any, tmp_path: Path) -> None:
    # Lines run below the body-limit middleware; over HTTP this body would be a 413 before any work.
    server = serve({"models": [FAKE]}, batch_dir=str(tmp_path), max_body_bytes=4096, access_log=False)
    rows = [
        line("big", {"model": "fake", "input": ["word " * 200] * 8}),
        line("small", {"model": "fake", "input": "a"}),
    ]
    with server.client() as http:
        batch = wait(http, start(http, rows)["id"], lambda job: job["status"] in DONE)
        assert batch["status"] == "completed", batch
        assert batch["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
        (failed,) = [
            orjson.loads(r) for r in http.get(f"/v1/files/{batch['error_file_id']}/content").content.splitlines()
        ]
        assert failed["response"]["status_code"] == 413
        assert "server.max_body_bytes" in failed["response"]["body"]["error"]["message"]


def test_concurrent_uploads_never_take_the_folder_past_its_budget(serve: Any, tmp_path: Path) -> None:
    """Each upload holds its declared size of the budget before a byte is read: eight uploads of
    400 KB against 1 MB beside a 500 KB file are refused before they are written, not after."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    budget = 1_000_000
    server = serve({"models": [FAKE]}, batch_dir=str(tmp_path), batch_max_disk_bytes=budget, access_log=False)
    folder = tmp_path / "files"

    def lines(size: int) -> bytes:
        row = orjson.dumps(line("x", {"model": "fake", "input": ["a" * 900]})) + b"\n"
        return b"".join(row.replace(b'"x"', b'"%d"' % i) for i in range(size // len(row)))

    peak, stop = [0], threading.Event()

    def size(path: Path) -> int:
        try:
            return path.stat().st_size
        except FileNotFoundError:  # removed between the listing and the look
            return 0

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], sum(size(p) for p in folder.glob("*")))

    with server.client() as http:
        assert upload(http, lines(500_000)).status_code == 200
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(lambda _: upload(http, lines(400_000)), range(8)))
        finally:
            stop.set()
            watcher.join()
        assert files_bytes(http) <= budget
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] + [413] * 7, statuses
    assert peak[0] <= budget, f"the folder held {peak[0]:,} bytes against a budget of {budget:,}"
