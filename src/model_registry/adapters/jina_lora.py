"""jina-embeddings-v3: a dense embedder whose batches run with their task's LoRA adapter.

The adapters are applied at run time (`backends/torch/lora.py`): on torch, the batch's task is selected
on every adapted layer before its forward pass; on ONNX Runtime, the export carries every task's
factors and takes the task as its `task_id` input. A batch holds one task: each item's
`Prepared.group` is its task, which the queue never mixes. An item without a task runs on the base
weights alone, as the published code does without one.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from model_registry.adapters.base import LoadOptions
from model_registry.adapters.dense import DenseAdapter, TextBatch
from model_registry.backends.base import LORA_FILE, TASK_INPUT
from model_registry.backends.torch import engine as backend
from model_registry.backends.torch import lora
from model_registry.detection.layout import Layout
from model_registry.errors import InvalidInput, ModelUnavailable
from model_registry.families.ports import jina_weights
from model_registry.types import EmbedItem, Item, Prepared


@dataclass(frozen=True)
class TaskBatch(TextBatch):
    """A text batch of one task (its index in `lora_adaptations`; None: no adapter)."""

    task: int | None = None


class JinaLoraAdapter(DenseAdapter):
    """A dense embedder whose batches run with their task's LoRA adapter (jina-embeddings-v3)."""

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        super().__init__(layout, trust_remote_code)
        config = layout.config
        self.tasks, self.rank, self.alpha = lora.settings(config)
        instructions = config.get("task_instructions") or {}
        self.task_prompts = {t: str(instructions.get(t) or "") for t in self.tasks}
        self.default_task = _default_task(layout, self.tasks)
        self.selection = lora.Selection()
        self._forwarding = threading.Lock()

    def build(self, options: LoadOptions) -> None:
        jina_weights(self.layout.transformer_dir)  # the export reads the split base weights and adapters
        super().build(options)

    def load(self, options: LoadOptions) -> None:
        jina_weights(self.layout.transformer_dir)
        super().load(options)
        engine = self.engine
        if not isinstance(engine, backend.TorchEngine):
            # ONNX Runtime's graph carries the adapters (`lora.for_export`); one without them
            # would answer every task with the base weights.
            if TASK_INPUT not in getattr(engine, "inputs", frozenset()):
                raise ModelUnavailable(
                    f"the ONNX graph of this model does not take '{TASK_INPUT}', so it would "
                    "ignore the task adapters; delete its engine cache entry to export it again, or use backend: torch"
                )
            return
        factors = lora.read_factors(self.layout.transformer_dir / LORA_FILE)
        before = engine.footprint()
        self.selection = lora.install(engine.model, factors, (len(self.tasks), self.rank), self.alpha / self.rank)
        self._footprint += engine.footprint() - before

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
        assert all(p.group == group for p in items), "This is a bug: a batch mixes tasks"
        text = self.text_batch(items)
        task = self.tasks.index(group) if group else None
        # The ONNX graph's index for no task is one past the tasks: its adapter of zeros.
        inputs = replace(text.inputs, task_id=len(self.tasks) if task is None else task)
        return TaskBatch(inputs, text.attention_mask, text.pool_mask, text.spans, task)

    def forward(self, batch: TextBatch) -> torch.Tensor:
        if not isinstance(self.engine, backend.TorchEngine):
            return super().forward(batch)
        with self._forwarding:  # the selection is the model's, read by its layers during this pass
            self.selection.task = batch.task if isinstance(batch, TaskBatch) else None
            return super().forward(batch)

    def family_facts(self) -> dict[str, Any]:
        adapters = {
            "tasks": list(self.tasks),
            "default_task": self.default_task,
            "rank": self.rank,
            "alpha": self.alpha,
        }
        return {**super().family_facts(), "task_adapters": adapters}


def _default_task(layout: Layout, tasks: tuple[str, ...]) -> str | None:
    """The entry's `options.default_task`, else config.json's `default_task`, else none."""
    chosen = layout.options.get("default_task", layout.config.get("default_task"))
    if chosen is not None and chosen not in tasks:
        raise ModelUnavailable(f"default_task '{chosen}' is not one of this model's tasks: {', '.join(tasks)}")
    return None if chosen is None else str(chosen)
