"""jina-embeddings-v3: a dense embedder whose batches run with their task's LoRA adapter.

The adapters are applied at run time (`backends/torch/lora.py`, `task_lora.TaskLoraAdapter`): on
torch, the batch's task is selected on every adapted layer before its forward pass; on ONNX
Runtime, the export carries every task's factors and takes the task as its `task_id` input. An item
without a task runs on the base weights alone, as the published code does without one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from model_registry.adapters.base import LoadOptions
from model_registry.adapters.task_lora import TaskBatch, TaskLoraAdapter
from model_registry.backends.base import LORA_FILE, TASK_INPUT
from model_registry.backends.torch import engine as backend
from model_registry.backends.torch import lora
from model_registry.detection.layout import Layout
from model_registry.errors import ModelUnavailable
from model_registry.families.ports import jina_weights
from model_registry.types import Prepared


class JinaLoraAdapter(TaskLoraAdapter):
    """A dense embedder whose batches run with their task's LoRA adapter (jina-embeddings-v3)."""

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        super().__init__(layout, trust_remote_code)
        config = layout.config
        self.tasks, self.rank, self.alpha = lora.settings(config)
        instructions = config.get("task_instructions") or {}
        self.task_prompts = {t: str(instructions.get(t) or "") for t in self.tasks}
        self.default_task = _default_task(layout, self.tasks)

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

    def collate(self, items: Sequence[Prepared]) -> TaskBatch:
        batch = super().collate(items)
        # The ONNX graph's index for no task is one past the tasks: its adapter of zeros.
        inputs = replace(batch.inputs, task_id=len(self.tasks) if batch.task is None else batch.task)
        return replace(batch, inputs=inputs)

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
