"""The result cache over HTTP: byte-identical answers, no cross-model or cross-option hits,
`X-Cache` and the hit ratio in `/metrics`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.builders.text import tiny_bert

pytestmark = pytest.mark.integration

TEXTS = ["A man is playing a guitar.", "A woman is slicing an onion.", "A man is playing a guitar."]


@pytest.fixture(scope="module")
def berts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two BERTs with one tokenizer and different weights (seeds)."""
    root = tmp_path_factory.mktemp("berts")
    prompts = {"query": "query: "}
    return tiny_bert(root / "a", seed=1, prompts=prompts), tiny_bert(root / "b", seed=2, prompts=prompts)


def entry(name: str, directory: Path, cache: dict[str, Any] | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"name": name, "source": str(directory), "backend": "torch", "pin": True}
    return found | ({"cache": cache} if cache is not None else {})


def embed(client: Any, model: str, texts: list[str], **extra: Any) -> tuple[str | None, bytes, Any]:
    """The `X-Cache` header, the answer's `data` and `usage` as bytes, and the whole body."""
    body = {"model": model, "input": texts, "encoding_format": "base64", **extra}
    response = client.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    wire = repr((answer["data"], answer["usage"])).encode()
    return response.headers.get("x-cache"), wire, answer


def test_a_cached_answer_is_byte_identical_to_a_computed_one(serve: Any, berts: tuple[Path, Path]) -> None:
    a, _ = berts
    server = serve({"models": [entry("cached", a, {"bytes": "1MiB"}), entry("plain", a)]})
    with server.client() as client:
        computed_header, computed, _ = embed(client, "plain", TEXTS)
        miss, first, _ = embed(client, "cached", TEXTS)
        hit, second, _ = embed(client, "cached", TEXTS)
        partial, _, _ = embed(client, "cached", [TEXTS[0], "Something new entirely."])
        metrics = client.get("/metrics").text
    assert computed_header is None  # no cache, no header
    assert (miss, hit, partial) == ("miss", "hit", "partial")
    assert first == computed
    assert second == computed
    # distinct inputs: 2 computed, then 2 found, then 1 found and 1 computed
    assert 'infinity_cache_lookups_total{model="cached",outcome="hit"} 3.0' in metrics
    assert 'infinity_cache_lookups_total{model="cached",outcome="miss"} 3.0' in metrics
    assert 'infinity_cache_hit_ratio{model="cached"} 0.5' in metrics


def test_the_cache_never_answers_with_another_model_s_or_option_s_result(
    serve: Any, berts: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = berts
    shared = {"bytes": "1MiB", "disk": str(tmp_path / "results")}  # one store: only the key keeps them apart
    models = [entry("a", a, shared), entry("b", b, shared), entry("plain_a", a), entry("plain_b", b)]
    server = serve({"models": models})
    options: list[dict[str, Any]] = [{}, {"prompt_name": "query"}, {"truncate_prompt_tokens": 4}]
    with server.client() as client:
        for extra in options:
            header_a, got_a, _ = embed(client, "a", TEXTS, **extra)
            header_b, got_b, _ = embed(client, "b", TEXTS, **extra)
            assert (header_a, header_b) == ("miss", "miss"), extra
            assert got_a == embed(client, "plain_a", TEXTS, **extra)[1]
            assert got_b == embed(client, "plain_b", TEXTS, **extra)[1]
            assert got_a != got_b
        header, again, _ = embed(client, "b", TEXTS, prompt_name="query")
        assert header == "hit"
        assert again == embed(client, "plain_b", TEXTS, prompt_name="query")[1]
    assert len(list((tmp_path / "results").glob("*.npz"))) == 2 * 3 * 2  # 2 models x 3 options x 2 texts


def test_the_disk_serves_a_restarted_server(serve: Any, berts: tuple[Path, Path], tmp_path: Path) -> None:
    a, _ = berts
    cache = {"bytes": "1MiB", "disk": str(tmp_path / "results")}
    with serve({"models": [entry("a", a, cache)]}).client() as client:
        _, computed, _ = embed(client, "a", TEXTS)
    with serve({"models": [entry("a", a, cache)]}).client() as client:
        header, found, _ = embed(client, "a", TEXTS)
    assert header == "hit"
    assert found == computed
