"""Admission over real HTTP: a flood is answered 200 or 429 at once, never after its deadline."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator

import pytest
from benchmarks.lib.rawhttp import Answer, encode, send
from benchmarks.lib.serving import free_port, start_server

from tests.builders.lifecycle import fake_model

pytestmark = pytest.mark.integration

DEADLINE = 4.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server process of its own, so that the flooding client shares no interpreter with it."""
    # 100 ms per batch of 256 tokens (85 of the 3-token inputs): 2,560 tokens a second, about 40
    # of the 192-token bulk requests in a deadline at the admission headroom.
    model = {**fake_model("slow", delay=0.1), "max_batch_tokens": 256}
    port = free_port()
    config = {"models": [model], "server": {"request_timeout": DEADLINE}}
    process = start_server(config, tmp_path_factory.mktemp("flood"), port)
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(30)


def test_a_flood_is_answered_200_or_429_and_never_after_its_deadline(server: str) -> None:
    bulk = encode(server, "/v1/embeddings", {"model": "slow", "input": [f"bulk text {i}" for i in range(64)]})
    small = encode(server, "/v1/embeddings", {"model": "slow", "input": ["a query"]})

    async def flood() -> tuple[list[Answer], list[Answer]]:
        await send(server, bulk)  # one batch measures the rate
        bulk_calls = [asyncio.ensure_future(send(server, bulk)) for _ in range(256)]
        await asyncio.sleep(1.5)  # the flood has been read and refused or admitted; bulk work runs
        queries = [await send(server, small) for _ in range(5)]
        return list(await asyncio.gather(*bulk_calls)), queries

    answers, queries = asyncio.run(flood())
    statuses = Counter(a.status for a in answers)
    assert set(statuses) <= {200, 429}, statuses
    assert statuses[200] >= 10, statuses
    assert statuses[429] >= 100, statuses
    late = sorted(a.seconds for a in answers if a.seconds >= DEADLINE)
    assert late == [], f"{len(late)} answers came after the {DEADLINE}s deadline"
    for answer in answers:
        if answer.status == 429:
            assert int(answer.headers["retry-after"]) >= 1
            body = answer.json()
            assert isinstance(body, dict)
            assert body["error"]["type"] == "rate_limit_error"
    # Small queries rank above the admitted bulk work: answered within a few batches.
    assert [a.status for a in queries] == [200] * 5
    # Bound (docs/reliability.md): the batch in flight, one aged bulk batch, its own: 3 x 100 ms.
    assert max(a.seconds for a in queries) < 0.5, [a.seconds for a in queries]
