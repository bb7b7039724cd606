"""Name -> model handle: lazy loading, one load at a time per model, request execution.

A request goes: validate -> lease the model (loading it if needed) -> price and admit (or 429) ->
`prepare` on the model's own threads -> the model's queue -> its worker -> the request resolved on
the caller's event loop; every step after admission counts against the request's deadline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from model_registry.adapters import Adapter
from model_registry.adapters.engines import check_engines
from model_registry.adapters.text import TextTokenizer
from model_registry.admission import OutputLimit, client_priority, deadline_after, price, tokenizing_price
from model_registry.batching import BatchQueue, Request
from model_registry.config import ModelSpec, RegistryConfig, load_config, registry_config
from model_registry.errors import (
    Cancelled,
    InvalidInput,
    ModelUnavailable,
    UnknownModel,
    UnsupportedOperation,
)
from model_registry.handles import DeviceUsage, LifecycleEvent, ModelHandle
from model_registry.lifecycle import Lifecycle
from model_registry.long_inputs import MODES as LONG_INPUT_MODES
from model_registry.long_inputs import Plan, Span, merge, plan_chunks, plan_late
from model_registry.ranking import (
    CROSS_ENCODER,
    Classification,
    PairScores,
    Ranking,
    check_pairs,
    check_rerank_input,
    classification,
    embedding_pair_scores,
    embedding_ranking,
    hybrid_outputs,
    hybrid_weights,
    method_output,
    pair_scores,
    ranking,
    rerank_method,
)
from model_registry.result_cache import caches_for
from model_registry.timing import StageTimes, report
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
    Token,
    TokenIds,
)
from model_registry.worker import BatchStats

log = logging.getLogger(__name__)

T = TypeVar("T")


def _enqueue(queue: BatchQueue, request: Request) -> None:
    """`queue.put(request)`, its refusal (a full queue, an unloading model) failing the request."""
    try:
        queue.put(request)
    except Exception as error:
        request.fail(error)


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
        self._started = False
        self._from_files: dict[str, tuple[Kind, frozenset[Capability]]] = {}
        self._caches = caches_for(config.models)

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

    async def start(self, *, wait: bool = True) -> None:
        """Start the lifecycle, which loads the pinned models in the background.

        `wait` returns once each pinned model has loaded or failed once (a failed one is logged,
        marked and retried after `failed_retry_after`); a server starts with `wait=False`, so that
        it answers `/health` (and `/ready` with 503) while they load."""
        if self._started:
            return
        self._started = True
        self._lifecycle.start()
        if wait:
            await self._lifecycle.pinned_tried.wait()

    async def stop(self) -> None:
        await self._lifecycle.stop()
        self._started = False

    async def __aenter__(self) -> Registry:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def pinned_tried(self) -> bool:
        """Every pinned model has loaded, or failed its first load, since the start."""
        return self._started and self._lifecycle.pinned_tried.is_set()

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
        kind, capabilities = (adapter.kind, adapter.capabilities) if adapter else self._kind_from_files(handle.spec)
        return ModelInfo(
            name=name,
            kind=kind,
            capabilities=capabilities,
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
            queue_tokens=handle.queue.pending_cost if handle.queue else 0,
            error=handle.error,
            extra=adapter.describe() if adapter and handle.state == ModelState.LOADED else {},
            loading_seconds=None if handle.load_started is None else time.monotonic() - handle.load_started,
        )

    def infos(self) -> list[ModelInfo]:
        return [self.info(name) for name in self._handles]

    def _kind_from_files(self, spec: ModelSpec) -> tuple[Kind, frozenset[Capability]]:
        """What a model that is not loaded is, from its configuration or its files (read once)."""
        if spec.name not in self._from_files:
            from model_registry.adapters import capabilities_of_kind, detect_kind

            try:
                kind = spec.kind if isinstance(spec.kind, Kind) else detect_kind(spec)
            except Exception:  # an unreadable model says why when it loads; here it stays unknown
                log.debug("cannot detect the kind of '%s' from its files", spec.name, exc_info=True)
                return Kind.DENSE, frozenset()
            self._from_files[spec.name] = (kind, capabilities_of_kind(kind))
        return self._from_files[spec.name]

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
        role: str | None = None,
        truncate: bool | None = None,
        truncation_direction: str = "right",
        max_tokens: int | None = None,
        output_limit: OutputLimit | None = None,
        priority: int | None = None,
        timeout: float | None = None,
        long_inputs: str = "error",
        spans: Sequence[Sequence[Span]] | None = None,
    ) -> Results:
        """Embed texts (or token-id lists, or media) with `model`; one result per input, in order.

        `role` ("query", "document", "classification"...) names a prompt used only when the model
        has it ("document" falls back to "passage"), as rerank does; `prompt_name` must exist.
        `truncation_direction` "left" cuts over-long texts at their start (dense, sparse, BGE-M3).
        `max_tokens` lowers the model's token limit for this request's texts, special tokens and
        prompt included (dense, sparse, BGE-M3): longer ones are cut, or refused without truncation.
        `output_limit` refuses (400), before any work, a request whose answer may be larger.
        `long_inputs` "chunk" embeds a text too long to take whole, when not truncated, as the
        pooled vectors of its overlapping windows (`long_inputs`); "error" refuses it (400).
        "late" reads each text whole (up to the model's length) and answers, as `multivector`, one
        vector per span: `spans[i]`'s character ranges of input i, or else its sentences.
        """
        handle = self._handle(model)
        contents = self._contents(inputs)
        adapter = await self._ensure_loaded(handle)
        wanted = frozenset(Output(o) for o in outputs)
        self._require_outputs(handle, adapter, contents, wanted)
        if prompt_name is None and prompt is None and role is not None:
            prompt = adapter.prompts.get(role, adapter.prompts.get("passage") if role == "document" else None)
        text_prompt = self._prompt(adapter, prompt_name, prompt)
        cut = handle.spec.truncate if truncate is None else truncate
        is_query = (prompt_name or role) == "query"
        if max_tokens is not None and any(isinstance(c, Text | TokenIds) for c in contents):
            if not getattr(adapter, "token_caps", False):
                raise UnsupportedOperation(
                    f"the model '{model}' does not take a per-request token limit", param="max_tokens"
                )
            self._text_tokenizer(adapter, model).cap(max_tokens)  # a limit too small for any text: 400 now
        left = self._left(adapter, model, truncation_direction)
        plan = None if cut else self._chunk_plan(adapter, model, contents, wanted, text_prompt, max_tokens, long_inputs)
        if plan is not None:
            contents = list(plan.contents)
        ranges: list[tuple[Span, ...]] = [()] * len(contents)
        if long_inputs == "late":
            contents, ranges = self._late_plan(adapter, model, contents, wanted, text_prompt, spans)
        items = [
            EmbedItem(c, wanted, text_prompt, is_query, cut, left, max_tokens, s)
            for c, s in zip(contents, ranges, strict=True)
        ]
        if output_limit is not None:
            output_limit.check(items, adapter.max_length, adapter.dimensions)
        results = await self.run(model, items, priority=priority, timeout=timeout)
        return results if plan is None else merge(results, plan, adapter.describe().get("normalize") is True)

    def _chunk_plan(
        self,
        adapter: Adapter,
        model: str,
        contents: Sequence[Content],
        wanted: frozenset[Output],
        prompt: str,
        max_tokens: int | None,
        mode: str,
    ) -> Plan | None:
        """The windows of a request's over-long texts under `long_inputs: "chunk"`; None otherwise."""
        if mode not in LONG_INPUT_MODES:
            raise InvalidInput(
                f"long_inputs is '{mode}'; use one of {', '.join(LONG_INPUT_MODES)}", param="long_inputs"
            )
        if mode in ("error", "late"):
            return None
        if wanted != {Output.DENSE}:
            raise UnsupportedOperation("long_inputs 'chunk' pools dense vectors only", param="long_inputs")
        tokenizer = self._text_tokenizer(adapter, model)
        cap = tokenizer.cap(max_tokens)
        return plan_chunks(contents, tokenizer, prompt, cap, self.config.max_chunks_per_request)

    def _late_plan(
        self,
        adapter: Adapter,
        model: str,
        contents: Sequence[Content],
        wanted: frozenset[Output],
        prompt: str,
        spans: Sequence[Sequence[Span]] | None,
    ) -> tuple[list[Content], list[tuple[Span, ...]]]:
        """Late chunking's whole texts and token ranges; only mean-pooled dense models take it."""
        pooling = adapter.describe().get("pooling")
        if wanted != {Output.DENSE} or pooling != "mean":
            raise UnsupportedOperation(
                f"long_inputs 'late' pools each span's tokens by their mean: only mean-pooled models take it "
                f"('{model}' pools by {pooling or 'its own head'})",
                param="long_inputs",
            )
        tokenizer = self._text_tokenizer(adapter, model)
        return plan_late(contents, tokenizer, prompt, spans, self.config.max_chunks_per_request)

    async def run(
        self, model: str, items: Sequence[Item], *, priority: int | None = None, timeout: float | None = None
    ) -> Results:
        """Run items through `model`'s queue; the core every operation shares.

        The request is priced and admitted before its inputs are prepared: `Overloaded` (429) when
        the model cannot serve it before its deadline at its measured rate. A model with a result
        cache answers the items it holds and computes the others once (`result_cache`)."""
        cache = self._caches.get(model)
        if cache is None:
            return await self._compute(model, items, priority, timeout)
        identity = await cache.identity(await self._ensure_loaded(self._handle(model)))
        return await cache.run(identity, items, lambda missing: self._compute(model, missing, priority, timeout))

    async def _compute(self, model: str, items: Sequence[Item], priority: int | None, timeout: float | None) -> Results:
        handle = self._handle(model)
        if not self._started:
            raise ModelUnavailable("the registry is not started (use 'async with Registry(...)' or start())")
        deadline = deadline_after(timeout or self.config.request_timeout)
        async with self._lifecycle.lease(handle) as lease:
            rank = lease.queue.priority_for(len(items), priority)
            cost = price(items, lease.adapter.max_length)
            reservation = lease.backlog.admit(cost, rank, deadline - time.monotonic())
            try:
                prepare_start = time.time()
                seconds = deadline - time.monotonic()
                prepared = await lease.stage.run(items, seconds, reads=tokenizing_price(items))
                reservation.reprice(sum(p.cost for p in prepared))
                request = Request.on_loop(prepared, priority=rank, deadline=deadline)
                enqueued = time.time()
                # Queued once this turn of the event loop is over, not now: the loop's own work
                # until it sleeps (this request's wait, the tasks it woke) would otherwise run
                # beside the forward pass it starts, on the cores the engine's threads are using.
                asyncio.get_running_loop().call_soon(_enqueue, lease.queue, request)
                results = await request.outcome()
            finally:
                reservation.release()
        if len(results) != len(items):
            raise Cancelled("the request was cancelled before all of its items ran")
        tokens = sum(p.tokens for p in prepared)
        report(StageTimes(model, len(items), tokens, prepare_start, enqueued, time.time(), tuple(request.batches)))
        return Results(tuple(results), tokens, tuple(p.tokens for p in sorted(prepared, key=lambda p: p.index)))

    def client_priority(self, requested: int | None, *, granted: bool) -> int | None:
        """The priority a client's request may have: lowering is free; raising it above the default
        needs `granted` (the key's `priority` scope) or the registry's `allow_client_priority`."""
        return client_priority(requested, may_raise=granted or self.config.allow_client_priority)

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

    async def _fit_left(
        self, adapter: Adapter, model: str, texts: Sequence[str], queries: Sequence[str] | None
    ) -> list[str]:
        """Texts (documents of pairs, or classified texts) cut at their start to fit, on the pool."""
        tokenizer = self._text_tokenizer(adapter, model)
        return await self._on_model_threads(model, lambda: tokenizer.fit_left(texts, queries))

    @staticmethod
    def _check_instruction(adapter: Adapter, model: str, instruction: str | None) -> None:
        if instruction is not None and not adapter.rerank_instructions:
            raise UnsupportedOperation(
                f"the model '{model}' takes no instruction; only LLM rerankers whose prompt has one do",
                param="instruction",
            )

    @staticmethod
    def _left(adapter: Adapter, model: str, direction: str, *, pairs: bool = False) -> bool:
        """Whether to cut at the start; pair and classify inputs are cut here, before the adapter."""
        sides: tuple[str, ...] = ("right", "left") if pairs else getattr(adapter, "truncation_sides", ("right",))
        if direction not in ("left", "right"):
            raise InvalidInput(
                f"truncation_direction must be left or right, got '{direction}'", param="truncation_direction"
            )
        if direction not in sides:
            raise UnsupportedOperation(
                f"the model '{model}' cuts over-long texts only on the {' or '.join(sides)}; "
                f"truncation_direction '{direction}' is not available for it",
                param="truncation_direction",
            )
        return direction == "left"

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
        # MaxSim over many pages is real compute: off the event loop, like every scoring step.
        return await asyncio.to_thread(media_scores, asked, documents, multivector=Output.MULTIVECTOR in outputs)

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
        truncation_direction: str = "right",
        max_tokens_per_doc: int | None = None,
        instruction: str | None = None,
        weights: Mapping[str, float | None] | None = None,
        return_parts: bool = False,
        priority: int | None = None,
        timeout: float | None = None,
    ) -> Ranking:
        """Rank `documents` by relevance to `query`, best first; `Ranking.method` says how.

        A cross-encoder applies its activation (sigmoid) unless `raw_scores`; embedding models
        score by MaxSim, sparse dot product or cosine, which have no activation to skip.
        `max_tokens_per_doc` scores only each document's first tokens (results keep the whole text);
        `truncation_direction` "left" cuts an over-long document at its start (the query stays whole).
        `instruction` replaces an LLM reranker's default instruction for this request.
        `weights` (or `return_parts`) ranks a model with several outputs by the weighted sum of
        their scores, omitted weights taking the model's defaults; `return_parts` keeps each part.
        """
        handle = self._handle(model)
        limits = self.config
        docs = check_rerank_input(query, documents, limits.max_inputs_per_request, limits.max_input_chars, top_n)
        adapter = await self._ensure_loaded(handle)
        method = rerank_method(adapter.capabilities, model)
        self._check_instruction(adapter, model, instruction)
        hybrid = None
        if weights is not None or return_parts:
            hybrid = hybrid_weights(adapter.capabilities, model, weights, handle.spec.rerank_weights)
        cut = handle.spec.truncate if truncate is None else truncate
        scored = docs
        if max_tokens_per_doc is not None:
            tokenizer = self._text_tokenizer(adapter, model)
            limit = max_tokens_per_doc
            scored = await self._on_model_threads(model, lambda: tokenizer.first_tokens(docs, limit))
        if method == CROSS_ENCODER:
            if cut and self._left(adapter, model, truncation_direction, pairs=True):
                scored = await self._fit_left(adapter, model, scored, [query] * len(scored))
            pairs = [PairItem(query, d, cut, instruction) for d in scored]
            results = await self.run(model, pairs, priority=priority, timeout=timeout)
            return ranking(docs, pair_scores(results.items, raw_scores), top_n, method, results.tokens)
        wanted = frozenset({method_output(method)}) if hybrid is None else hybrid_outputs(hybrid, return_parts)
        prompts = adapter.prompts
        left = self._left(adapter, model, truncation_direction)
        query_item = EmbedItem(Text(query), wanted, prompts.get("query", ""), True, cut, left)
        doc_prompt = prompts.get("document", prompts.get("passage", ""))
        items = [query_item, *(EmbedItem(Text(d), wanted, doc_prompt, False, cut, left) for d in scored)]
        results = await self.run(model, items, priority=priority, timeout=timeout)
        # BGE-M3 averages MaxSim over the query's tokens; ColBERT sums it. Off the event loop: MaxSim
        # over many documents is real compute.
        mean, parts = adapter.kind == Kind.MULTI_OUTPUT, return_parts
        return await asyncio.to_thread(embedding_ranking, docs, results, method, hybrid, top_n, mean, parts)

    async def classify(
        self,
        model: str,
        texts: Sequence[str],
        *,
        raw_scores: bool = False,
        truncate: bool | None = None,
        truncation_direction: str = "right",
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
        texts = [c.text for c in contents if isinstance(c, Text)]
        if cut and self._left(adapter, model, truncation_direction, pairs=True):
            texts = await self._fit_left(adapter, model, texts, None)
        items = [ClassifyItem(t, cut) for t in texts]
        results = await self.run(model, items, priority=priority, timeout=timeout)
        return classification(results.items, raw_scores, results.tokens)

    async def score(
        self,
        model: str,
        pairs: Sequence[tuple[str, str]],
        *,
        raw_scores: bool = False,
        truncate: bool | None = None,
        truncation_direction: str = "right",
        priority: int | None = None,
        timeout: float | None = None,
    ) -> PairScores:
        """A relevance score per (text_1, text_2) pair, in input order.

        A cross-encoder reads each pair (its activation applied unless `raw_scores`); an embedding
        model embeds each distinct text once, without prompts, and scores the pair by cosine
        (MaxSim for multi-vector models, dot product for sparse ones).
        """
        handle = self._handle(model)
        checked = check_pairs(pairs, self.config.max_inputs_per_request, self.config.max_input_chars)
        adapter = await self._ensure_loaded(handle)
        method = rerank_method(adapter.capabilities, model)
        cut = handle.spec.truncate if truncate is None else truncate
        if method == CROSS_ENCODER:
            if cut and self._left(adapter, model, truncation_direction, pairs=True):
                seconds = await self._fit_left(adapter, model, [b for _, b in checked], [a for a, _ in checked])
                checked = [(a, b) for (a, _), b in zip(checked, seconds, strict=True)]
            results = await self.run(
                model, [PairItem(a, b, cut) for a, b in checked], priority=priority, timeout=timeout
            )
            return PairScores(tuple(pair_scores(results.items, raw_scores)), method, results.tokens)
        texts = list(dict.fromkeys(t for pair in checked for t in pair))
        wanted = frozenset({method_output(method)})
        left = self._left(adapter, model, truncation_direction)
        items = [EmbedItem(Text(t), wanted, "", False, cut, left) for t in texts]
        results = await self.run(model, items, priority=priority, timeout=timeout)
        embedded = dict(zip(texts, results.items, strict=True))
        # A score per pair (MaxSim over token vectors for some models) is real compute: off the
        # event loop, as rerank's is.
        scores = await asyncio.to_thread(embedding_pair_scores, method, checked, embedded)
        return PairScores(tuple(scores), method, results.tokens)

    # ---- tokens --------------------------------------------------------------------------------

    async def tokenize(
        self, model: str, texts: Sequence[str], *, add_special_tokens: bool = True, prompt_name: str | None = None
    ) -> list[list[Token]]:
        """Each text's tokens as `model` reads them (its prompt first when `prompt_name` is given)."""
        contents = self._contents(texts)
        if not all(isinstance(c, Text) for c in contents):
            raise InvalidInput("tokenize takes texts", param="inputs")
        adapter = await self._ensure_loaded(self._handle(model))
        tokenizer = self._text_tokenizer(adapter, model)
        prompt = self._prompt(adapter, prompt_name, None) if prompt_name else ""
        prompted = [prompt + c.text for c in contents if isinstance(c, Text)]
        return await self._on_model_threads(
            model, lambda: tokenizer.tokens(prompted, add_special_tokens=add_special_tokens)
        )

    async def decode(self, model: str, ids: Sequence[Sequence[int]], *, skip_special_tokens: bool = True) -> list[str]:
        """Token ids back to text with `model`'s tokenizer; ids outside its vocabulary are `InvalidInput`."""
        self._contents(ids)
        adapter = await self._ensure_loaded(self._handle(model))
        tokenizer = self._text_tokenizer(adapter, model)
        return await self._on_model_threads(
            model, lambda: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        )

    async def _on_model_threads(self, model: str, fn: Callable[[], T]) -> T:
        """`fn` on `model`'s own prepare threads, where its requests' tokenizing runs."""
        stage = self._handle(model).stage
        if stage is None:
            raise ModelUnavailable(f"model '{model}' was unloaded; retry the request")
        return await stage.call(fn)

    @staticmethod
    def _text_tokenizer(adapter: Adapter, model: str) -> TextTokenizer:
        tokenizer = getattr(adapter, "tokenizer", None)
        if not isinstance(tokenizer, TextTokenizer):
            raise UnsupportedOperation(f"the model '{model}' has no text tokenizer to show", param="model")
        return tokenizer
