"""A synchronous face of `Registry` for scripts: an event loop on a background thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

from model_registry.config import RegistryConfig
from model_registry.registry import Registry
from model_registry.types import ModelInfo, Results

T = TypeVar("T")


class SyncRegistry:
    """`with SyncRegistry.from_config(path) as reg: reg.embed("all-MiniLM-L6-v2", ["..."])`."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        # Made on entering, so that a registry never entered holds no loop (and its socket pair).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def from_config(cls, source: str | Path | RegistryConfig | Mapping[str, Any]) -> SyncRegistry:
        return cls(Registry.from_config(source))

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            coroutine.close()
            raise RuntimeError("SyncRegistry is used outside its `with` block")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def __enter__(self) -> SyncRegistry:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="registry-loop", daemon=True)
        self._thread.start()
        try:
            self._call(self.registry.start())
        except BaseException:
            self._close_loop()  # `__exit__` does not run when `__enter__` raises
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._call(self.registry.stop())
        finally:
            self._close_loop()

    def _close_loop(self) -> None:
        loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()

    def embed(self, model: str, inputs: Any, **options: Any) -> Results:
        return self._call(self.registry.embed(model, inputs, **options))

    def load(self, name: str) -> ModelInfo:
        return self._call(self.registry.load(name))

    def unload(self, name: str) -> ModelInfo:
        return self._call(self.registry.unload(name))

    def infos(self) -> list[ModelInfo]:
        return self.registry.infos()
