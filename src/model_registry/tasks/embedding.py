"""Embed: texts, token ids or media to dense, sparse or multi-vector outputs, one result per
input, over `Runner.run`; with prompts, task adapters, truncation, a per-request token limit and
the two ways of taking texts longer than the model (`long_inputs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from model_registry.adapters.base import Adapter
from model_registry.errors import InvalidInput, UnsupportedOperation
from model_registry.media.pages import Page, render
from model_registry.media.similarity import matryoshka
from model_registry.runtime.admission import OutputLimit
from model_registry.runtime.runner import Runner
from model_registry.tasks import validation
from model_registry.tasks.long_inputs import MODES as LONG_INPUT_MODES
from model_registry.tasks.long_inputs import Plan, Span, merge, plan_chunks, plan_late
from model_registry.tasks.validation import RawInput
from model_registry.types import Content, Embedding, EmbedItem, Mixed, Output, Results, Text, TokenIds

#: A role or prompt name -> the tasks it means on a model that has tasks: jina-v3's task adapters,
#: or a Router's routes (`adapters/router.py`); the first the model has.
ROLE_TASKS = {
    "query": ("retrieval.query", "query"),
    "document": ("retrieval.passage", "document"),
    "passage": ("retrieval.passage", "document"),
    "corpus": ("document",),
    "classification": ("classification",),
    "clustering": ("separation",),
}


@dataclass(frozen=True)
class EmbedCall:
    """One embed call: what each dialect turns its body into (`Registry.embed_call`), and what
    `Registry.embed`'s keywords build.

    Embed texts (or token-id lists, or media) with `model`; one result per input, in order.

    `role` ("query", "document", "classification"...) names a prompt used only when the model
    has it ("document" falls back to "passage"), as rerank does; `prompt_name` must exist.
    `task` picks the task adapter of a model that has them (`Adapter.tasks`, jina-embeddings-v3),
    which puts its instruction before each text unless a prompt is named; without one, a
    `prompt_name` or `role` that means a task picks it (`ROLE_TASKS`), else the model's default;
    a role that means no task takes the model's prompt of that name, as without tasks.
    `truncation_direction` "left" cuts over-long texts at their start (dense, sparse, BGE-M3).
    `max_tokens` lowers the model's token limit for this request's texts, special tokens and
    prompt included (dense, sparse, BGE-M3): longer ones are cut, or refused without truncation.
    `output_limit` refuses (400), before any work, a request whose answer may be larger.
    `long_inputs` "chunk" embeds a text too long to take whole, when not truncated, as the
    pooled vectors of its overlapping windows (`long_inputs`); "error" refuses it (400).
    "late" reads each text whole (up to the model's length) and answers, as `multivector`, one
    vector per span: `spans[i]`'s character ranges of input i, or else its sentences.
    `dimensions` cuts each dense vector to its first components, re-normalised (a Matryoshka cut),
    checked against the model's width before any work (400 naming `dimensions_param`).
    """

    model: str
    inputs: Sequence[RawInput]
    outputs: Sequence[Output | str] = (Output.DENSE,)
    prompt_name: str | None = None
    prompt: str | None = None
    role: str | None = None
    task: str | None = None
    truncate: bool | None = None
    truncation_direction: str = "right"
    max_tokens: int | None = None
    output_limit: OutputLimit | None = None
    priority: int | None = None
    timeout: float | None = None
    long_inputs: str = "error"
    spans: Sequence[Sequence[Span]] | None = None
    dimensions: int | None = None
    dimensions_param: str = "dimensions"


async def embed(registry: Runner, model: str, inputs: Sequence[RawInput], **options: Any) -> Results:
    """Embed `inputs` with `model`; one result per input, in order. `options` are `EmbedCall`'s."""
    return await embed_call(registry, EmbedCall(model, inputs, **options))


async def embed_call(registry: Runner, request: EmbedCall) -> Results:
    """Run one `EmbedCall`."""
    model, inputs, outputs, task = request.model, request.inputs, request.outputs, request.task
    prompt_name, prompt, role = request.prompt_name, request.prompt, request.role
    truncate, max_tokens, long_inputs, dimensions = (
        request.truncate,
        request.max_tokens,
        request.long_inputs,
        request.dimensions,
    )
    truncation_direction, spans, output_limit = request.truncation_direction, request.spans, request.output_limit
    dimensions_param, priority, timeout = request.dimensions_param, request.priority, request.timeout
    spec = registry.spec(model)
    contents = validation.contents(inputs, registry.config)
    adapter = await registry.adapter(model)
    validation.require_mixed(model, adapter, contents)
    wanted = frozenset(Output(o) for o in outputs)
    validation.require_outputs(model, adapter, wanted)
    if dimensions is not None:
        _check_cut(adapter, model, wanted, dimensions, dimensions_param)
    task, text_prompt = _task_prompt(adapter, model, task, prompt_name, prompt, role)
    cut = spec.truncate if truncate is None else truncate
    is_query = (prompt_name or role) == "query"
    if max_tokens is not None and any(isinstance(c, Text | TokenIds | Mixed) for c in contents):
        if not adapter.token_caps:
            raise UnsupportedOperation(
                f"the model '{model}' does not take a per-request token limit", param="max_tokens"
            )
        validation.text_tokenizer(adapter, model).cap(max_tokens)  # a limit too small for any text: 400 now
    left = validation.cut_left(adapter, model, truncation_direction)
    plan = None
    if not cut:
        plan = await _chunk_plan(registry, adapter, model, contents, wanted, text_prompt, max_tokens, long_inputs)
    if plan is not None:
        contents = list(plan.contents)
    ranges: list[tuple[Span, ...]] = [()] * len(contents)
    if long_inputs == "late":
        contents, ranges = await _late_plan(registry, adapter, model, contents, wanted, text_prompt, spans)
    items = [
        EmbedItem(c, wanted, text_prompt, is_query, cut, left, max_tokens, s, task)
        for c, s in zip(contents, ranges, strict=True)
    ]
    if output_limit is not None:
        output_limit.check(items, adapter.max_length, dimensions or adapter.dimensions)
    results = await registry.run(model, items, priority=priority, timeout=timeout)
    if plan is not None:
        results = merge(results, plan, adapter.describe().get("normalize") is True)
    return results if dimensions is None else _cut(results, dimensions)


async def pages(
    registry: Runner, model: str, document: bytes, index: int = 0, *, max_pages: int | None = None
) -> list[Page]:
    """The pages of the PDF `document` (input `index`) as images for the page model `model`,
    rendered at its working resolution on its prepare threads; at most `max_pages` (else the
    registry's `max_pdf_pages`), counted before any page is rendered."""
    adapter = await registry.adapter(model)
    if adapter.page_pixels is None:
        raise UnsupportedOperation(
            f"input {index} is a PDF, which is rendered to page images for page models (ColPali, ColQwen2, "
            f"ColModernVBert); the model '{model}' is not one",
            param="input",
        )
    limits, pixels = registry.config, adapter.page_pixels
    most = limits.max_pdf_pages if max_pages is None else max_pages
    return await registry.on_model_threads(
        model,
        lambda: render(document, index, page_pixels=pixels, max_pages=most, max_pixels=limits.max_image_pixels),
    )


def _check_cut(adapter: Adapter, model: str, wanted: frozenset[Output], dimensions: int, param: str) -> None:
    """A Matryoshka cut a request asks for, refused before any work where it cannot apply."""
    if Output.DENSE not in wanted:
        raise InvalidInput(f"{param} cuts a dense vector; this request asks for no dense output", param=param)
    width = adapter.dimensions
    if not 1 <= dimensions <= (width if width is not None else dimensions):
        raise InvalidInput(
            f"{param} must be between 1 and {width} for the model '{model}', got {dimensions}", param=param
        )


def _cut(results: Results, dimensions: int) -> Results:
    """Each dense vector's first `dimensions` components, re-normalised."""
    items = tuple(
        replace(r, dense=matryoshka(r.dense, dimensions)) if isinstance(r, Embedding) and r.dense is not None else r
        for r in results.items
    )
    return replace(results, items=items)


def _task_prompt(
    adapter: Adapter, model: str, task: str | None, prompt_name: str | None, prompt: str | None, role: str | None
) -> tuple[str | None, str]:
    """The task adapter a request runs with (None: none) and the prompt put before its texts."""
    if not adapter.tasks:
        if task is not None:
            raise InvalidInput(
                f"the model '{model}' has no task adapters; `task` applies to models that have them "
                "(jina-embeddings-v3)",
                param="task",
            )
        if prompt_name is None and prompt is None and role is not None:
            prompt = adapter.prompts.get(role, adapter.prompts.get("passage") if role == "document" else None)
        return None, validation.prompt_text(adapter, prompt_name, prompt)
    if task is not None and task not in adapter.tasks:
        known = ", ".join(adapter.tasks)
        raise InvalidInput(f"unknown task '{task}'; the model '{model}' has the tasks: {known}", param="task")
    chosen = task or _named_task(adapter, prompt_name) or _named_task(adapter, role) or adapter.default_task
    named = prompt_name is not None and (prompt_name in adapter.prompts or _named_task(adapter, prompt_name) is None)
    if prompt is not None or named or chosen is None:
        return chosen, validation.prompt_text(adapter, prompt_name, prompt)
    if prompt_name is None and role is not None and _named_task(adapter, role) is None:
        # A role that means no task may name a prompt (jina-embeddings-v4's "passage").
        found = adapter.prompts.get(role, adapter.prompts.get("passage") if role == "document" else None)
        if found is not None:
            return chosen, found
    return chosen, adapter.task_prompts.get(chosen, "")


def _named_task(adapter: Adapter, name: str | None) -> str | None:
    """The task a prompt name or role means on `adapter`: a task's own name, or `ROLE_TASKS`'."""
    if name is None or name in adapter.tasks:
        return name
    return next((task for task in ROLE_TASKS.get(name, ()) if task in adapter.tasks), None)


async def _chunk_plan(
    registry: Runner,
    adapter: Adapter,
    model: str,
    contents: Sequence[Content],
    wanted: frozenset[Output],
    prompt: str,
    max_tokens: int | None,
    mode: str,
) -> Plan | None:
    """The windows of a request's over-long texts under `long_inputs: "chunk"`; None otherwise.
    Tokenizing whole texts is planned on the model's prepare threads, as its requests' tokenizing."""
    if mode not in LONG_INPUT_MODES:
        raise InvalidInput(f"long_inputs is '{mode}'; use one of {', '.join(LONG_INPUT_MODES)}", param="long_inputs")
    if mode in ("error", "late"):
        return None
    if wanted != {Output.DENSE}:
        raise UnsupportedOperation("long_inputs 'chunk' pools dense vectors only", param="long_inputs")
    tokenizer = validation.text_tokenizer(adapter, model)
    cap = tokenizer.cap(max_tokens)
    limit = registry.config.max_chunks_per_request
    return await registry.on_model_threads(model, lambda: plan_chunks(contents, tokenizer, prompt, cap, limit))


async def _late_plan(
    registry: Runner,
    adapter: Adapter,
    model: str,
    contents: Sequence[Content],
    wanted: frozenset[Output],
    prompt: str,
    spans: Sequence[Sequence[Span]] | None,
) -> tuple[list[Content], list[tuple[Span, ...]]]:
    """Late chunking's whole texts and token ranges (planned on the model's prepare threads); only
    mean-pooled dense models take it."""
    pooling = adapter.describe().get("pooling")
    if wanted != {Output.DENSE} or pooling != "mean":
        raise UnsupportedOperation(
            f"long_inputs 'late' pools each span's tokens by their mean: only mean-pooled models take it "
            f"('{model}' pools by {pooling or 'its own head'})",
            param="long_inputs",
        )
    tokenizer = validation.text_tokenizer(adapter, model)
    limit = registry.config.max_chunks_per_request
    return await registry.on_model_threads(model, lambda: plan_late(contents, tokenizer, prompt, spans, limit))
