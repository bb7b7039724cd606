"""Classify texts and pairs of texts on top of `Runner.run`: each input's label scores, softmax unless
raw, best first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from model_registry.runtime.runner import Runner
from model_registry.tasks import validation
from model_registry.tasks.rerank import fit_left
from model_registry.types import Capability, ClassifyItem, Labels, Result


@dataclass(frozen=True, slots=True)
class LabelScore:
    label: str
    score: float


@dataclass(frozen=True, slots=True)
class Classification:
    """Per input, every label with its score, best first."""

    results: tuple[tuple[LabelScore, ...], ...]
    tokens: int


def classification(results: Sequence[Result], raw_scores: bool, tokens: int) -> Classification:
    """Softmax over each input's label logits (or the logits themselves), labels best first."""
    rows = []
    for result in results:
        if not isinstance(result, Labels):
            raise TypeError(f"This is a bug: a classifier returned {type(result).__name__}")
        logits = np.asarray(result.logits, dtype=np.float64)
        values = logits if raw_scores else _softmax(logits)
        ranked = sorted(zip(result.names, values.tolist(), strict=True), key=lambda pair: -pair[1])
        rows.append(tuple(LabelScore(name, float(value)) for name, value in ranked))
    return Classification(tuple(rows), tokens)


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max())
    out: np.ndarray = shifted / shifted.sum()
    return out


async def classify(
    registry: Runner,
    model: str,
    inputs: Sequence[str | Sequence[str]],
    *,
    raw_scores: bool = False,
    truncate: bool | None = None,
    truncation_direction: str = "right",
    priority: int | None = None,
    timeout: float | None = None,
) -> Classification:
    """Label scores per input (softmax over the labels unless `raw_scores`), best first.

    An input is a text, or a pair `[text, text_pair]` read together as `tokenizer(text,
    text_pair)` reads it (an NLI model's premise and hypothesis); a request may hold both. An
    over-long pair loses tokens from its longer text first, at the end of the texts or, with
    `truncation_direction` "left", at their start; a single text cut on the left loses its first
    words, cut at a word boundary."""
    spec = registry.spec(model)
    refusal = "classification takes texts or pairs of texts, not token ids or media"
    checked = validation.texts_or_pairs(inputs, registry.config, refusal)
    adapter = await registry.adapter(model)
    validation.require(model, adapter, Capability.CLASSIFY, "classify")
    cut = spec.truncate if truncate is None else truncate
    left = bool(cut) and validation.cut_left(adapter, model, truncation_direction, pairs=True)
    singles = [i for i, (_, pair) in enumerate(checked) if pair is None]
    if left and singles:
        fitted = await fit_left(registry, adapter, model, [checked[i][0] for i in singles], None)
        for i, text in zip(singles, fitted, strict=True):
            checked[i] = (text, None)
    # A single text is already cut to fit; a pair is cut by the tokenizer, which alone knows how
    # its two texts share the limit.
    items = [ClassifyItem(text, cut, pair, left and pair is not None) for text, pair in checked]
    results = await registry.run(model, items, priority=priority, timeout=timeout)
    return classification(results.items, raw_scores, results.tokens)
