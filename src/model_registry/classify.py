"""Classify texts on top of `Runner.run`: each text's label scores, softmax unless raw, best first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from model_registry import validation
from model_registry.ranking import fit_left
from model_registry.runner import Runner
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
    texts: Sequence[str],
    *,
    raw_scores: bool = False,
    truncate: bool | None = None,
    truncation_direction: str = "right",
    priority: int | None = None,
    timeout: float | None = None,
) -> Classification:
    """Label scores per text (softmax over the labels unless `raw_scores`), best first."""
    spec = registry.spec(model)
    checked = validation.texts(texts, registry.config, "classification takes texts, not token ids or media")
    adapter = await registry.adapter(model)
    validation.require(model, adapter, Capability.CLASSIFY, "classify")
    cut = spec.truncate if truncate is None else truncate
    if cut and validation.cut_left(adapter, model, truncation_direction, pairs=True):
        checked = await fit_left(registry, adapter, model, checked, None)
    items = [ClassifyItem(t, cut) for t in checked]
    results = await registry.run(model, items, priority=priority, timeout=timeout)
    return classification(results.items, raw_scores, results.tokens)
