"""TEI's `/info` and the bound on `/tokenize`'s answer, on a server configured away from the
defaults: each number asserted here is set by this module's configuration, not read from the server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import LiveServer, start_server
from tests.integration.dialects.conftest import TEXTS, post

pytestmark = pytest.mark.integration

PREPARE_THREADS = 3
QUEUED_ITEMS = 4096
BATCH_TOKENS = 2048
#: The smallest answer the settings allow: 18 tokens at the fewest bytes a token takes (54).
OUTPUT_BYTES = 1024


@pytest.fixture(scope="module")
def configured_server(dialect_models: dict[str, Path]) -> Iterator[LiveServer]:
    from infinity_server.app import create_app
    from infinity_server.settings import ServerSettings, Settings
    from model_registry.config import registry_config

    entry = {
        "name": "dense",
        "source": str(dialect_models["dense"]),
        "truncate": False,
        "max_queued_items": QUEUED_ITEMS,
        "max_batch_tokens": BATCH_TOKENS,
    }
    registry = registry_config({"models": [entry], "prepare_threads": PREPARE_THREADS})
    live = start_server(create_app(Settings(ServerSettings(max_output_bytes=OUTPUT_BYTES), registry)))
    yield live
    live.close()


def test_info_reports_the_configured_limits(configured_server: LiveServer) -> None:
    """TEI's `Info` has these as numbers and a bool, never null; the batch budget shows once the
    model has loaded (it depends on the device), as /v1/models shows it."""
    with configured_server.client() as client:
        before = client.get("/info").json()
        post(configured_server, "/embed", {"inputs": "loads the model"})
        after = client.get("/info").json()
        listed = client.get("/v1/models/dense").json()
    assert before["status"] == "unloaded"
    assert before["max_batch_tokens"] is None
    assert after["max_batch_tokens"] == BATCH_TOKENS == listed["details"]["batch_budget"]["tokens"]
    for described in (before, after):
        assert described["served_model_name"] == "dense"
        assert described["max_concurrent_requests"] == QUEUED_ITEMS
        assert described["tokenization_workers"] == PREPARE_THREADS
        assert described["auto_truncate"] is False
        assert described["max_batch_requests"] is None
        assert described["max_client_batch_size"] == 2048


def test_tokenize_answer_is_bounded_by_max_output_bytes(configured_server: LiveServer) -> None:
    """Untruncated tokens could make any answer: more tokens than can fit are refused as they are
    counted, and an answer whose JSON passes the limit is refused before it is sent."""
    with configured_server.client() as client:
        fits = client.post("/tokenize", json={"inputs": TEXTS[0]})
        too_many = client.post("/tokenize", json={"inputs": " ".join([TEXTS[1]] * 3)})  # 26 tokens
        too_large = client.post("/tokenize", json={"inputs": " ".join([TEXTS[1]] * 2)})  # 18 tokens
    assert fits.status_code == 200, fits.text
    assert len(fits.content) <= OUTPUT_BYTES
    assert [t["text"] for t in fits.json()[0]] == ["[CLS]", "A", "man", "is", "playing", "a", "guitar", ".", "[SEP]"]
    for refused in (too_many, too_large):
        assert refused.status_code == 400, refused.text
        assert refused.json()["error_type"] == "Validation"
    assert "26 tokens" in too_many.json()["error"]
    assert "max_output_bytes (1,024 bytes)" in too_large.json()["error"]
