"""Embed: texts, token ids or media to dense, sparse or multi-vector outputs, one result per
input, over `Runner.run`; with prompts, truncation, a per-request token limit and the two ways of
taking texts longer than the model (`long_inputs`).
"""

from __future__ import annotations

from collections.abc import Sequence

from model_registry import validation
from model_registry.adapters.base import Adapter
from model_registry.admission import OutputLimit
from model_registry.errors import InvalidInput, UnsupportedOperation
from model_registry.long_inputs import MODES as LONG_INPUT_MODES
from model_registry.long_inputs import Plan, Span, merge, plan_chunks, plan_late
from model_registry.runner import Runner
from model_registry.types import Content, EmbedItem, Output, Results, Text, TokenIds
from model_registry.validation import RawInput


async def embed(
    registry: Runner,
    model: str,
    inputs: Sequence[RawInput],
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
    spec = registry.spec(model)
    contents = validation.contents(inputs, registry.config)
    adapter = await registry.adapter(model)
    wanted = frozenset(Output(o) for o in outputs)
    validation.require_outputs(model, adapter, wanted)
    if prompt_name is None and prompt is None and role is not None:
        prompt = adapter.prompts.get(role, adapter.prompts.get("passage") if role == "document" else None)
    text_prompt = validation.prompt_text(adapter, prompt_name, prompt)
    cut = spec.truncate if truncate is None else truncate
    is_query = (prompt_name or role) == "query"
    if max_tokens is not None and any(isinstance(c, Text | TokenIds) for c in contents):
        if not adapter.token_caps:
            raise UnsupportedOperation(
                f"the model '{model}' does not take a per-request token limit", param="max_tokens"
            )
        validation.text_tokenizer(adapter, model).cap(max_tokens)  # a limit too small for any text: 400 now
    left = validation.cut_left(adapter, model, truncation_direction)
    plan = None
    if not cut:
        plan = _chunk_plan(registry, adapter, model, contents, wanted, text_prompt, max_tokens, long_inputs)
    if plan is not None:
        contents = list(plan.contents)
    ranges: list[tuple[Span, ...]] = [()] * len(contents)
    if long_inputs == "late":
        contents, ranges = _late_plan(registry, adapter, model, contents, wanted, text_prompt, spans)
    items = [
        EmbedItem(c, wanted, text_prompt, is_query, cut, left, max_tokens, s)
        for c, s in zip(contents, ranges, strict=True)
    ]
    if output_limit is not None:
        output_limit.check(items, adapter.max_length, adapter.dimensions)
    results = await registry.run(model, items, priority=priority, timeout=timeout)
    return results if plan is None else merge(results, plan, adapter.describe().get("normalize") is True)


def _chunk_plan(
    registry: Runner,
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
        raise InvalidInput(f"long_inputs is '{mode}'; use one of {', '.join(LONG_INPUT_MODES)}", param="long_inputs")
    if mode in ("error", "late"):
        return None
    if wanted != {Output.DENSE}:
        raise UnsupportedOperation("long_inputs 'chunk' pools dense vectors only", param="long_inputs")
    tokenizer = validation.text_tokenizer(adapter, model)
    cap = tokenizer.cap(max_tokens)
    return plan_chunks(contents, tokenizer, prompt, cap, registry.config.max_chunks_per_request)


def _late_plan(
    registry: Runner,
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
    tokenizer = validation.text_tokenizer(adapter, model)
    return plan_late(contents, tokenizer, prompt, spans, registry.config.max_chunks_per_request)
