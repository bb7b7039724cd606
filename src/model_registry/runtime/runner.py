"""What the task modules (embedding, ranking, scoring, classify, media_rerank, tokens) need of the
registry: a model's settings, its loaded adapter, its queue (`run`) and its threads.

`Registry` is the one implementation; the tasks depend on this contract, not on it, so that the
dependencies point one way: `registry` -> the tasks -> this module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from model_registry.adapters.base import Adapter
from model_registry.config import ModelSpec, RegistryConfig
from model_registry.types import Item, Results

T = TypeVar("T")


class Runner(Protocol):
    config: RegistryConfig

    def spec(self, model: str) -> ModelSpec:
        """`model`'s configuration; `UnknownModel` (404) for a name that is not configured."""
        ...

    async def adapter(self, model: str) -> Adapter:
        """`model`'s adapter, loading the model first if it is not loaded."""
        ...

    async def run(
        self, model: str, items: Sequence[Item], *, priority: int | None = None, timeout: float | None = None
    ) -> Results:
        """Run `items` through `model`'s queue: priced, admitted, prepared, batched, one result each."""
        ...

    async def on_model_threads(self, model: str, fn: Callable[[], T]) -> T:
        """`fn` on `model`'s own prepare threads, where its requests' tokenizing runs."""
        ...
