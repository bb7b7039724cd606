"""Dense embedders whose batches run with one of several LoRA adapters: each item's adapter is its
`EmbedItem.task`, carried as its `Prepared.group`, which the queue never mixes; on torch, the
batch's adapter is selected on every adapted layer before its forward pass (`backends/torch/lora.py`).
An item without one runs on the base weights alone."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from model_registry.adapters.dense import DenseAdapter, TextBatch
from model_registry.backends.torch import engine as backend
from model_registry.backends.torch import lora
from model_registry.detection.layout import Layout
from model_registry.errors import InvalidInput
from model_registry.types import EmbedItem, Item, Prepared


@dataclass(frozen=True)
class TaskBatch(TextBatch):
    """A text batch of one adapter (its index among the model's; None: no adapter)."""

    task: int | None = None


class TaskLoraAdapter(DenseAdapter):
    """A dense embedder with `tasks`, LoRA adapters chosen per item and applied per batch."""

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        super().__init__(layout, trust_remote_code)
        self.selection = lora.Selection()
        self._forwarding = threading.Lock()

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        tasks = [self._task(i, item) or "" for i, item in enumerate(items)]
        return [replace(p, group=task) for p, task in zip(super().prepare(items), tasks, strict=True)]

    def _task(self, index: int, item: Item) -> str | None:
        task = item.task if isinstance(item, EmbedItem) else None
        if task is not None and task not in self.tasks:
            raise InvalidInput(
                f"input {index}: unknown task '{task}'; use one of {', '.join(self.tasks)}", param="task"
            )
        return task

    def collate(self, items: Sequence[Prepared]) -> TaskBatch:
        group = items[0].group
        assert all(p.group == group for p in items), "This is a bug: a batch mixes adapters"
        text = self.text_batch(items)
        task = self.tasks.index(group) if group else None
        return TaskBatch(text.inputs, text.attention_mask, text.pool_mask, text.spans, task)

    def forward(self, batch: TextBatch) -> torch.Tensor:
        if not isinstance(self.engine, backend.TorchEngine):
            return super().forward(batch)
        with self._forwarding:  # the selection is the model's, read by its layers during this pass
            self.selection.task = batch.task if isinstance(batch, TaskBatch) else None
            return super().forward(batch)
