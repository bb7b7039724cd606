"""Worst-case batches for every model kind: what a CUDA load runs once to measure its working memory.

A model's footprint on CUDA is its weights plus the peak of its largest batch. Each kind fills one
batch at its `max_batch_tokens` with the longest inputs it takes: texts of its maximum length
(embedders with every output they produce, rerankers with query-document pairs, classifiers),
images that its processor turns into the most patches it allows, audio clips of the window it
reads. A model with two towers (CLIP, CLAP) runs both; the peak over all of them is its footprint.

Every load, on any device, also times one such batch (`measure_rate`): admission then knows the
model's rate before its first request, and a cold model admits by deadline like a warm one. A
model with `max_batch_tokens: auto` times a few budgets instead and keeps the best
(`measure_budget`).
"""

from __future__ import annotations

import dataclasses
import io
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from model_registry.adapters.base import Adapter
from model_registry.backends import devices
from model_registry.errors import RegistryError
from model_registry.types import (
    Capability,
    ClassifyItem,
    EmbedItem,
    Item,
    Media,
    Modality,
    Output,
    PairItem,
    Prepared,
    Text,
    TokenIds,
)

log = logging.getLogger(__name__)

#: Side of the square image used for image models: processors resize to their own size; models of
#: dynamic resolution (ColQwen2) cap their patches, which this side reaches.
IMAGE_SIDE = 1024
#: Seconds of audio for audio models: at least the window CLAP-style models read.
AUDIO_SECONDS = 30.0
_FALLBACK_LENGTH = 512
#: A warm-up batch that took this many seconds is timed once, not again.
SLOW_BATCH = 2.0


def worst_case_batches(adapter: Adapter, max_batch_tokens: int, *, first: bool = False) -> list[list[Item]]:
    """One batch per input kind the model takes, each holding as many of its longest inputs as
    fit `max_batch_tokens` (counted from what the model's own preparation says they cost); with
    `first`, only the first kind's batch that the model can prepare."""
    caps = adapter.capabilities
    length = min(adapter.max_length or _FALLBACK_LENGTH, max_batch_tokens)
    words = " ".join(["word"] * length)  # one token or more per word: truncated at the model's length
    longest: list[Item] = []
    if Capability.RERANK in caps:
        longest.append(PairItem(words, words))
    if Capability.CLASSIFY in caps:
        longest.append(ClassifyItem(words))
    outputs = _text_outputs(caps)
    if outputs:
        # Token id 1 is inside every text model's vocabulary; client-given ids are the whole sequence.
        # Others (ColBERT, media towers) take text only: their texts are cut at their own length.
        ids = Capability.EMBED_TEXT in caps and not caps & {Capability.EMBED_IMAGE, Capability.EMBED_AUDIO}
        longest.append(EmbedItem(TokenIds((1,) * length) if ids else Text(words), outputs))
    media = _media_outputs(caps)
    if Capability.EMBED_IMAGE in caps:
        longest.append(EmbedItem(Media(Modality.IMAGE, _image()), media))
    if Capability.EMBED_AUDIO in caps:
        longest.append(EmbedItem(Media(Modality.AUDIO, _audio()), media))
    batches = []
    for item in longest:
        batch = _filled(adapter, item, max_batch_tokens)
        if batch:
            batches.append(batch)
            if first:
                break
    return batches


def run_batches(adapter: Adapter, batches: Sequence[Sequence[Item]]) -> int:
    """Run each batch (copies of one input) through every stage; the number that ran (one the
    model refuses is skipped)."""
    ran = 0
    for items in batches:
        try:
            _run(adapter, _prepared(adapter, items))
        except RegistryError as error:
            log.warning("no warm-up of %s on %s: %s", type(adapter).__name__, type(items[0]).__name__, error)
            continue
        ran += 1
    return ran


@dataclass(frozen=True, slots=True)
class Rate:
    """What a timed warm-up batch measured: its cost (tokens, patches, frames) and its seconds."""

    cost: int
    seconds: float


def measure_rate(adapter: Adapter, max_batch_tokens: int) -> Rate | None:
    """Time one full batch of the model's longest inputs through every stage, so that admission
    knows the model's rate before its first request (None when no batch of it could run).

    The batch runs twice, the second timed (a first call pays one-time costs: lazy kernels,
    allocator growth), unless the first alone took `SLOW_BATCH` seconds or more."""
    batches = worst_case_batches(adapter, max_batch_tokens, first=True)
    if not batches:
        return None
    prepared = _prepared(adapter, batches[0])
    seconds = _timed(adapter, prepared)
    if seconds < SLOW_BATCH:
        seconds = _timed(adapter, prepared)
    return Rate(sum(p.cost for p in prepared), seconds)


@dataclass(frozen=True, slots=True)
class Budget:
    """A model's batch budget in tokens (as its adapter's `batch_cost` counts them), why it is
    what it is, and the timed batches behind a measured one."""

    tokens: int
    #: "configured" (the model's `max_batch_tokens`), "device default" or "measured".
    chosen_by: str
    rate: Rate | None = None
    #: Measured: each budget tried, its batch's cost and seconds, smallest budget first.
    trials: tuple[tuple[int, Rate], ...] = ()

    def describe(self) -> dict[str, object]:
        facts: dict[str, object] = {"tokens": self.tokens, "chosen_by": self.chosen_by}
        if self.trials:
            facts["trials"] = [
                {"tokens": tokens, "batch_seconds": round(r.seconds, 4), "tokens_per_second": round(r.cost / r.seconds)}
                for tokens, r in self.trials
            ]
        return facts


#: A budget is kept over a smaller one only for at least this much more throughput (timing noise).
BUDGET_GAIN = 1.05


def measure_budget(adapter: Adapter, candidates: Sequence[int], max_seconds: float) -> Budget | None:
    """Time a full batch of the model's longest inputs at each budget in `candidates` (smallest
    first, stopping at the first batch over `max_seconds`) and keep the smallest budget within
    `BUDGET_GAIN` of the best throughput among those within `max_seconds` (the smallest one when
    none is). None when no batch of the model could run."""
    trials: list[tuple[int, Rate]] = []
    for tokens in sorted(candidates):
        batches = worst_case_batches(adapter, tokens, first=True)
        if not batches:
            return None
        prepared = _prepared(adapter, batches[0])
        seconds = _timed(adapter, prepared)
        if seconds < SLOW_BATCH:  # the first run of a shape pays one-time costs
            seconds = min(seconds, _timed(adapter, prepared))
        trials.append((tokens, Rate(sum(p.cost for p in prepared), seconds)))
        if seconds > max_seconds:
            break
    within = [(tokens, rate) for tokens, rate in trials if rate.seconds <= max_seconds] or trials[:1]
    best = max(rate.cost / rate.seconds for _, rate in within)
    tokens, rate = next((t, r) for t, r in within if r.cost / r.seconds * BUDGET_GAIN >= best)
    return Budget(tokens, "measured", rate, tuple(trials))


def _prepared(adapter: Adapter, items: Sequence[Item]) -> list[Prepared]:
    """A batch's copies of one input, prepared (decoded, tokenized) once and used n times."""
    one = adapter.prepare(items[:1])[0]
    return [dataclasses.replace(one, index=i) for i in range(len(items))]


def _run(adapter: Adapter, prepared: list[Prepared]) -> None:
    _timed(adapter, prepared)


def _timed(adapter: Adapter, prepared: list[Prepared]) -> float:
    """Seconds of the batch through every stage: collated here, computed on the thread the model
    computes on when it serves (a CPU torch model: the shared torch thread, whose OpenMP pool it
    then uses), a wait for that thread not counted."""
    started = time.perf_counter()
    collated = adapter.collate(prepared)
    collating = time.perf_counter() - started

    def compute() -> float:
        began = time.perf_counter()
        adapter.postprocess(collated, adapter.forward(collated))
        return time.perf_counter() - began

    shared = devices.compute_thread(adapter.backend, devices.memory_device(adapter.device or "cpu"))
    return collating + (shared.call(compute) if shared is not None else compute())


def _text_outputs(caps: frozenset[Capability]) -> frozenset[Output]:
    # Late-interaction models (ColBERT, ColPali) give token vectors only; BGE-M3 gives all three.
    late = Capability.MULTIVECTOR in caps and Capability.SPARSE not in caps
    wanted = {Output.DENSE} if Capability.EMBED_TEXT in caps and not late else set()
    if Capability.SPARSE in caps:
        wanted.add(Output.SPARSE)
    if Capability.MULTIVECTOR in caps:
        wanted.add(Output.MULTIVECTOR)
    return frozenset(wanted)


def _media_outputs(caps: frozenset[Capability]) -> frozenset[Output]:
    return frozenset({Output.MULTIVECTOR}) if Capability.MULTIVECTOR in caps else frozenset({Output.DENSE})


def _filled(adapter: Adapter, item: Item, max_batch_tokens: int) -> list[Item]:
    """As many copies of `item` as one batch holds, from the cost its preparation reports."""
    try:
        cost = adapter.prepare([item])[0].cost
    except RegistryError as error:
        if isinstance(item, EmbedItem) and isinstance(item.content, TokenIds):
            # A model that takes no token ids (the fake one): its longest text instead.
            words = Text(" ".join(["word"] * len(item.content.ids)))
            return _filled(adapter, dataclasses.replace(item, content=words), max_batch_tokens)
        log.warning("no warm-up of %s on %s: %s", type(adapter).__name__, type(item).__name__, error)
        return []
    return [item] * max(1, max_batch_tokens // max(1, cost))


def _image() -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _audio(rate: int = 48_000) -> bytes:
    import soundfile

    samples = np.random.default_rng(0).uniform(-0.5, 0.5, int(AUDIO_SECONDS * rate)).astype(np.float32)
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV")
    return buffer.getvalue()
