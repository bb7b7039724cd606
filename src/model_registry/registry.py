"""Name -> model handle: lazy loading, one load at a time per model, request execution.

A request goes: validate -> find or load the model -> `prepare` in the shared worker pool ->
the model's queue -> its worker -> the future resolved on the caller's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from model_registry.adapters import Adapter
from model_registry.adapters.engines import check_engines
from model_registry.batching import Request
from model_registry.config import ModelSpec, RegistryConfig, load_config, registry_config
from model_registry.errors import (
    Cancelled,
    DeadlineExceeded,
    InvalidInput,
    ModelUnavailable,
    RegistryError,
    UnknownModel,
    UnsupportedOperation,
)
from model_registry.handles import DeviceUsage, LifecycleEvent, ModelHandle
from model_registry.lifecycle import Lifecycle
from model_registry.ranking import (
    CROSS_ENCODER,
    Classification,
    Ranking,
    check_rerank_input,
    classification,
    embedding_scores,
    method_output,
    pair_scores,
    ranking,
    rerank_method,
)
from model_registry.types import (
    Capability,
    ClassifyItem,
    Content,
    EmbedItem,
    Item,
    Kind,
    Media,
    ModelInfo,
    ModelState,
    Output,
    PairItem,
    Results,
    Text,
    TokenIds,
)
from model_registry.worker import BatchStats

log = logging.getLogger(__name__)


class Registry:
    """The engine, usable in-process: `async with Registry.from_config(path) as reg: ...`."""

    def __init__(
        self,
        config: RegistryConfig,
        *,
        on_batch: Callable[[BatchStats], None] | None = None,
        on_event: Callable[[LifecycleEvent], None] | None = None,
    ) -> None:
        self.config = config
        check_engines(config.models)  # a combination no engine runs stops the start, naming the fix
        self._handles = {spec.name: ModelHandle(spec) for spec in config.models}
        self._lifecycle = Lifecycle(config, self._handles, on_batch=on_batch, on_event=on_event)
        self._pool: ThreadPoolExecutor | None = None
        self._started = False

    @classmethod
    def from_config(cls, source: str | Path | RegistryConfig | Mapping[str, Any], **kwargs: Any) -> Registry:
        """From a YAML path, a validated config or a mapping with `models` (and registry limits)."""
        if isinstance(source, RegistryConfig):
            config = source
        elif isinstance(source, Mapping):
            config = registry_config(source)
        else:
            config = load_config(source)
        return cls(config, **kwargs)

    # ---- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the worker pool and load the pinned models (a broken one is logged and marked)."""
        if self._started:
            return
        self._pool = ThreadPoolExecutor(self.config.prepare_threads, thread_name_prefix="prepare")
        self._started = True
        self._lifecycle.start()
        for handle in self._handles.values():
            if handle.spec.pin:
                try:
                    await self._ensure_loaded(handle)
                except RegistryError as error:
                    log.error("pinned model '%s' failed to load: %s", handle.spec.name, error)

    async def stop(self) -> None:
        await self._lifecycle.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._started = False

    async def __aenter__(self) -> Registry:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def ready(self) -> bool:
        """Every pinned model loaded and its worker alive."""
        return self._started and all(
            h.state == ModelState.LOADED and h.worker is not None and h.worker.alive
            for h in self._handles.values()
            if h.spec.pin
        )

    # ---- information ---------------------------------------------------------------------------

    def names(self) -> list[str]:
        return list(self._handles)

    def info(self, name: str) -> ModelInfo:
        handle = self._handle(name)
        adapter = handle.adapter
        return ModelInfo(
            name=name,
            kind=adapter.kind if adapter else self._declared_kind(handle.spec),
            capabilities=adapter.capabilities if adapter else frozenset(),
            backend=adapter.backend if adapter else handle.spec.backend,
            device=getattr(adapter, "device", handle.spec.device) if adapter else handle.spec.device,
            dtype=str(getattr(adapter, "dtype", handle.spec.dtype)).removeprefix("torch.")
            if adapter
            else handle.spec.dtype,
            state=handle.state,
            pinned=handle.spec.pin,
            max_length=adapter.max_length if adapter else None,
            dimensions=adapter.dimensions if adapter else None,
            footprint_bytes=handle.footprint if adapter and handle.state == ModelState.LOADED else None,
            last_used=handle.last_used,
            queue_depth=handle.queue.depth if handle.queue else 0,
            error=handle.error,
            extra=adapter.describe() if adapter and handle.state == ModelState.LOADED else {},
        )

    def infos(self) -> list[ModelInfo]:
        return [self.info(name) for name in self._handles]

    @staticmethod
    def _declared_kind(spec: ModelSpec) -> Kind:
        return spec.kind if isinstance(spec.kind, Kind) else Kind.DENSE

    def _handle(self, name: str) -> ModelHandle:
        handle = self._handles.get(name)
        if handle is None:
            raise UnknownModel(name, list(self._handles))
        return handle

    # ---- loading -------------------------------------------------------------------------------

    async def load(self, name: str) -> ModelInfo:
        """Load `name` now (evicting idle models if needed); a failed model is retried at once."""
        await self._ensure_loaded(self._handle(name), retry_failed=True)
        return self.info(name)

    async def unload(self, name: str) -> ModelInfo:
        """Unload `name` once its work in flight is done; pinned models cannot be unloaded."""
        await self._lifecycle.unload_by_request(self._handle(name))
        return self.info(name)

    @property
    def events(self) -> list[LifecycleEvent]:
        """Recent loads, evictions, unloads and expiries, oldest first."""
        return list(self._lifecycle.events)

    def memory(self) -> list[DeviceUsage]:
        """Per device: its budget and the bytes charged to loaded and loading models."""
        return self._lifecycle.usage()

    async def _ensure_loaded(self, handle: ModelHandle, *, retry_failed: bool = False) -> Adapter:
        if not self._started:
            raise ModelUnavailable("the registry is not started (use 'async with Registry(...)' or start())")
        return await self._lifecycle.ensure_loaded(handle, retry_failed=retry_failed)

    async def _unload(self, handle: ModelHandle) -> None:
        await self._lifecycle.unload(handle)

    # ---- operations ----------------------------------------------------------------------------

    async def embed(
        self,
        model: str,
        inputs: Sequence[str | Sequence[int] | Content],
        *,
        outputs: Sequence[Output | str] = (Output.DENSE,),
        prompt_name: str | None = None,
        prompt: str | None = None,
        truncate: bool | None = None,
        priority: int | None = None,
        timeout: float | None = None,
    ) -> Results:
        """Embed texts (or token-id lists, or media) with `model`; one result per input, in order."""
        handle = self._handle(model)
        contents = self._contents(inputs)
        adapter = await self._ensure_loaded(handle)
        wanted = frozenset(Output(o) for o in outputs)
        self._require_outputs(handle, adapter, contents, wanted)
        text_prompt = self._prompt(adapter, prompt_name, prompt)
        cut = handle.spec.truncate if truncate is None else truncate
        items = [EmbedItem(c, wanted, text_prompt, prompt_name == "query", cut) for c in contents]
        return await self.run(model, items, priority=priority, timeout=timeout)

    async def run(
        self, model: str, items: Sequence[Item], *, priority: int | None = None, timeout: float | None = None
    ) -> Results:
        """Run prepared-to-be items through `model`'s queue; the core every operation shares."""
        handle = self._handle(model)
        loop = asyncio.get_running_loop()
        adapter = await self._ensure_loaded(handle)
        assert self._pool is not None, "This is a bug: no prepare pool on a started registry"
        assert handle.queue is not None, "This is a bug: a loaded model has no queue"
        # Counted before the next await, so the model cannot be evicted between load and queue.
        handle.inflight += 1
        self._lifecycle.touch(handle)
        try:
            prepared = await loop.run_in_executor(self._pool, adapter.prepare, items)
            future: asyncio.Future[Request] = loop.create_future()

            def settle(request: Request) -> None:
                if not future.done():
                    future.set_result(request)

            def on_done(request: Request) -> None:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                    loop.call_soon_threadsafe(settle, request)

            limit = timeout or self.config.request_timeout
            request = Request(
                prepared,
                priority=handle.queue.priority_for(len(prepared), priority),
                deadline=time.monotonic() + limit,
                on_done=on_done,
            )
            handle.queue.put(request)
            try:
                done = await asyncio.wait_for(future, limit)
            except asyncio.TimeoutError:
                request.cancel()
                raise DeadlineExceeded(f"the request did not finish within {limit:g}s") from None
            except asyncio.CancelledError:
                request.cancel()
                raise
            if done.error is not None:
                raise done.error
            results = tuple(r for r in done.results if r is not None)
            if len(results) != len(items):
                raise Cancelled("the request was cancelled before all of its items ran")
            return Results(results, sum(p.tokens for p in prepared))
        finally:
            handle.inflight -= 1
            self._lifecycle.touch(handle)

    # ---- validation ----------------------------------------------------------------------------

    def _contents(self, inputs: Sequence[str | Sequence[int] | Content]) -> list[Content]:
        if isinstance(inputs, str) or not isinstance(inputs, Sequence):
            raise InvalidInput("input must be a list", param="input")
        if not inputs:
            raise InvalidInput("input must not be empty", param="input")
        limit = self.config.max_inputs_per_request
        if len(inputs) > limit:
            raise InvalidInput(
                f"input has {len(inputs)} items; at most {limit} are accepted per request", param="input"
            )
        return [self._content(i, value) for i, value in enumerate(inputs)]

    def _content(self, index: int, raw: str | Sequence[int] | Content) -> Content:
        value: object = raw
        if isinstance(raw, str):
            value = Text(raw)
        elif isinstance(raw, Sequence) and not isinstance(raw, (bytes, bytearray)):
            if not raw or not all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
                raise InvalidInput(f"input {index} must be a string or a non-empty list of token ids", param="input")
            value = TokenIds(tuple(int(t) for t in raw))
        if isinstance(value, Text):
            if not value.text.strip():
                raise InvalidInput(f"input {index} is empty; every input needs some text", param="input")
            if len(value.text) > self.config.max_input_chars:
                raise InvalidInput(
                    f"input {index} has {len(value.text):,} characters; the limit is {self.config.max_input_chars:,}",
                    param="input",
                )
        if not isinstance(value, (Text, TokenIds, Media)):
            raise InvalidInput(f"input {index} is of an unsupported type {type(raw).__name__}", param="input")
        return value

    @staticmethod
    def _require_outputs(
        handle: ModelHandle, adapter: Adapter, contents: list[Content], wanted: frozenset[Output]
    ) -> None:
        caps = adapter.capabilities
        needed = {Output.SPARSE: Capability.SPARSE, Output.MULTIVECTOR: Capability.MULTIVECTOR}
        missing = [o.value for o in wanted if o in needed and needed[o] not in caps]
        dense_capable = {Capability.EMBED_TEXT, Capability.EMBED_IMAGE, Capability.EMBED_AUDIO} & caps
        if Output.DENSE in wanted and not dense_capable:
            missing.append("dense")
        if missing:
            have = ", ".join(sorted(c.value for c in caps)) or "none"
            raise UnsupportedOperation(
                f"the model '{handle.spec.name}' cannot produce {', '.join(missing)} output; "
                f"its capabilities are: {have}",
                param="model",
            )

    @staticmethod
    def _prompt(adapter: Adapter, prompt_name: str | None, prompt: str | None) -> str:
        if prompt is not None:
            return prompt
        name = prompt_name or adapter.default_prompt_name
        if name is None:
            return ""
        if name not in adapter.prompts:
            known = ", ".join(sorted(adapter.prompts)) or "none"
            raise InvalidInput(f"unknown prompt_name '{name}'; this model's prompts are: {known}", param="prompt_name")
        return adapter.prompts[name]

    # ---- media rerank ----------------------------------------------------------------------------

    async def rerank_media(
        self,
        model: str,
        query: str,
        media: Sequence[Media],
        *,
        priority: int | None = None,
        timeout: float | None = None,
    ) -> Results:
        """Score each image (or audio clip) against a text query; one `Score` per item, in input order.

        Multi-vector models (ColPali) score by MaxSim over their token vectors; the others (CLIP,
        open_clip, CLAP) by the cosine of their vectors in the shared space.
        """
        from model_registry.media import media_rerank_outputs, media_scores

        adapter = await self._ensure_loaded(self._handle(model))
        outputs = media_rerank_outputs(model, adapter.capabilities, query)
        options: dict[str, Any] = {"outputs": outputs, "priority": priority, "timeout": timeout}
        asked, documents = await asyncio.gather(
            self.embed(model, [query], **options), self.embed(model, list(media), **options)
        )
        return media_scores(asked, documents, multivector=Output.MULTIVECTOR in outputs)

    # ---- rerank and classify -------------------------------------------------------------------

    async def rerank(
        self,
        model: str,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        raw_scores: bool = False,
        truncate: bool | None = None,
        priority: int | None = None,
        timeout: float | None = None,
    ) -> Ranking:
        """Rank `documents` by relevance to `query`, best first; `Ranking.method` says how.

        A cross-encoder applies its activation (sigmoid) unless `raw_scores`; embedding models
        score by MaxSim, sparse dot product or cosine, which have no activation to skip.
        """
        handle = self._handle(model)
        limits = self.config
        docs = check_rerank_input(query, documents, limits.max_inputs_per_request, limits.max_input_chars, top_n)
        adapter = await self._ensure_loaded(handle)
        method = rerank_method(adapter.capabilities, model)
        cut = handle.spec.truncate if truncate is None else truncate
        if method == CROSS_ENCODER:
            pairs = [PairItem(query, d, cut) for d in docs]
            results = await self.run(model, pairs, priority=priority, timeout=timeout)
            return ranking(docs, pair_scores(results.items, raw_scores), top_n, method, results.tokens)
        wanted = frozenset({method_output(method)})
        prompts = adapter.prompts
        query_item = EmbedItem(Text(query), wanted, prompts.get("query", ""), True, cut)
        doc_prompt = prompts.get("document", prompts.get("passage", ""))
        items = [query_item, *(EmbedItem(Text(d), wanted, doc_prompt, False, cut) for d in docs)]
        results = await self.run(model, items, priority=priority, timeout=timeout)
        # BGE-M3 averages MaxSim over the query's tokens; ColBERT sums it.
        scores = embedding_scores(
            method, results.items[0], results.items[1:], mean_maxsim=adapter.kind == Kind.MULTI_OUTPUT
        )
        return ranking(docs, scores, top_n, method, results.tokens)

    async def classify(
        self,
        model: str,
        texts: Sequence[str],
        *,
        raw_scores: bool = False,
        truncate: bool | None = None,
        priority: int | None = None,
        timeout: float | None = None,
    ) -> Classification:
        """Label scores per text (softmax over the labels unless `raw_scores`), best first."""
        handle = self._handle(model)
        contents = self._contents(texts)
        if not all(isinstance(c, Text) for c in contents):
            raise InvalidInput("classification takes texts, not token ids or media", param="input")
        adapter = await self._ensure_loaded(handle)
        if Capability.CLASSIFY not in adapter.capabilities:
            have = ", ".join(sorted(c.value for c in adapter.capabilities)) or "none"
            raise UnsupportedOperation(
                f"the model '{model}' cannot classify; its capabilities are: {have}", param="model"
            )
        cut = handle.spec.truncate if truncate is None else truncate
        items = [ClassifyItem(c.text, cut) for c in contents if isinstance(c, Text)]
        results = await self.run(model, items, priority=priority, timeout=timeout)
        return classification(results.items, raw_scores, results.tokens)
