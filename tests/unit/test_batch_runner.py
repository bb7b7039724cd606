"""A batch line's retries, driven by a scripted route: 429 waits as told (else backs off 1, 2, 4 ...
30 s) and runs again up to `OVERLOADED_RETRIES` times; 503 and 504 run again four times, backing off
2, 4, 8 and 16 s unless told otherwise."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest

from infinity_server.batches.lines import Answer, Line
from infinity_server.batches.runner import OVERLOADED_RETRIES, RETRIES, Runner
from infinity_server.batches.store import JobRecord, LineResult

LINE = Line(7, "request-7", "/v1/embeddings", b'{"model": "m", "input": ["a"]}')
JOB = cast(JobRecord, SimpleNamespace(id="batch_1", owner="key-a"))


class Script:
    """The route's answers, in order; records each call's owner and line id."""

    def __init__(self, *answers: Answer) -> None:
        self.answers: Iterator[Answer] = iter(answers)
        self.calls: list[tuple[str, str]] = []

    async def __call__(self, line: Line, owner: str, ident: str) -> Answer:
        self.calls.append((owner, ident))
        return next(self.answers)


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The seconds each retry would wait; nothing waits."""
    seen: list[float] = []

    async def sleep(seconds: float) -> None:
        seen.append(seconds)

    monkeypatch.setattr("infinity_server.batches.runner.asyncio.sleep", sleep)
    return seen


async def answer(script: Script) -> LineResult:
    runner = Runner(cast(Any, None), cast(Any, None), cast(Any, script), 1, cast(Any, None), lambda: True)
    return await runner._answer(JOB, LINE)


def ok() -> Answer:
    return Answer(200, b'{"data": []}')


async def test_a_429_waits_as_told_and_never_uses_up_the_retries(waits: list[float]) -> None:
    script = Script(*[Answer(429, b"{}", 2.5)] * 6, Answer(429, b"{}"), ok())
    result = await answer(script)
    assert (result.line, result.custom_id, result.status, result.body) == (7, "request-7", 200, b'{"data": []}')
    assert waits == [2.5] * 6 + [30.0]  # no Retry-After: the back-off of a seventh refusal, at most 30 s
    assert len(script.calls) == 8
    assert {owner for owner, _ in script.calls} == {"key-a"}
    assert len({ident for _, ident in script.calls}) == 1  # every try is the same line


async def test_503_and_504_back_off_and_run_again_up_to_four_times(waits: list[float]) -> None:
    assert RETRIES == 4
    script = Script(Answer(503, b"{}"), Answer(504, b"{}"), Answer(503, b"{}", 3.0), Answer(503, b"{}"), ok())
    result = await answer(script)
    assert result.status == 200
    assert waits == [2.0, 4.0, 3.0, 16.0]


async def test_the_fifth_503_stands_as_the_lines_answer(waits: list[float]) -> None:
    unavailable = b'{"error": {"message": "model m is loading"}}'
    script = Script(*[Answer(503, unavailable)] * 5, ok())
    result = await answer(script)
    assert (result.status, result.body) == (503, unavailable)
    assert len(script.calls) == 5
    assert waits == [2.0, 4.0, 8.0, 16.0]


async def test_429s_between_failures_do_not_count_as_failures(waits: list[float]) -> None:
    script = Script(Answer(503, b"{}"), Answer(429, b"{}", 0.5), Answer(503, b"{}"), ok())
    assert (await answer(script)).status == 200
    assert waits == [2.0, 0.5, 4.0]


@pytest.mark.parametrize("status", [200, 400, 404, 413, 422, 500])
async def test_other_answers_stand_at_once(waits: list[float], status: int) -> None:
    script = Script(Answer(status, b"{}"), ok())
    assert (await answer(script)).status == status
    assert waits == []
    assert len(script.calls) == 1


async def test_429s_back_off_and_stand_after_their_bound(waits: list[float]) -> None:
    """A line refused for load again and again (a server too busy for it) ends with its 429."""
    assert OVERLOADED_RETRIES == 128
    busy = b'{"error": {"message": "over capacity"}}'
    script = Script(*[Answer(429, busy)] * (OVERLOADED_RETRIES + 1), ok())
    result = await answer(script)
    assert (result.status, result.body) == (429, busy)
    assert len(script.calls) == OVERLOADED_RETRIES + 1
    assert waits[:6] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0]
    assert set(waits[5:]) == {30.0}
