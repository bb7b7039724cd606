"""jina-embeddings-v3's LoRA task adapters, on transformers' native jina_embeddings_v3 port.

The published checkpoint adapts every linear and embedding layer of its encoder with one low-rank
pair per task (`lora_adaptations` in config.json), scaled by s = lora_alpha / lora_rank: a linear
weight W (out, in) becomes W + s * B[t] @ A[t], an embedding table (rows, dim) W + s * A[t] @ B[t].
The base weights stay as loaded and each adapted layer adds its task's low-rank term to its
output: the merged weight's numbers, at rank/width of the layer's cost, with no copy of the model
per task. `native_ports` lays out the files (base weights, and the factors in `lora.safetensors`).

A batch holds one task: each item's `Prepared.group` is its task, which the queue never mixes,
and the batch's task is selected on every adapted layer just before its forward pass. An item
without a task runs on the base weights alone, as the published code does without one.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional

from model_registry.adapters.base import LoadOptions
from model_registry.adapters.dense import DenseAdapter, TextBatch
from model_registry.backends import create_engine
from model_registry.backends import torch as backend
from model_registry.backends.base import Engine
from model_registry.backends.choice import Choice
from model_registry.detect import Layout
from model_registry.errors import InvalidInput, ModelUnavailable
from model_registry.native_ports import LORA_FILE, jina_weights
from model_registry.types import EmbedItem, Item, Prepared

_SUFFIX = ".parametrizations.weight.0.lora_"
_LAYER = re.compile(r"encoder\.layers\.(\d+)\.(mixer\.Wqkv|mixer\.out_proj|mlp\.fc1|mlp\.fc2)")
#: The published layer -> its module(s) in transformers' port (Wqkv is q, k and v there).
_PORT = {
    "mixer.Wqkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mixer.out_proj": ("self_attn.o_proj",),
    "mlp.fc1": ("mlp.fc1",),
    "mlp.fc2": ("mlp.fc2",),
}


class Selection:
    """The task index every adapted layer of one model reads (None: the base weights alone)."""

    task: int | None = None


class LoraLinear(torch.nn.Module):
    """`base(x) + s * x A[t]^T B[t]^T`: the linear layer with task t's adapter merged in."""

    lora_a: torch.Tensor
    lora_b: torch.Tensor

    def __init__(self, base: torch.nn.Linear, a: torch.Tensor, b: torch.Tensor, scale: float, selection: Selection):
        super().__init__()
        self.base, self.scale, self.selection = base, scale, selection
        self.register_buffer("lora_a", a, persistent=False)  # (tasks, rank, in)
        self.register_buffer("lora_b", b, persistent=False)  # (tasks, out, rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.base(x)
        task = self.selection.task
        if task is None:
            return out
        return out + self.scale * functional.linear(functional.linear(x, self.lora_a[task]), self.lora_b[task])


class LoraEmbedding(torch.nn.Module):
    """`base(ids) + s * A[t][ids] B[t]`: the embedding table with task t's adapter merged in."""

    lora_a: torch.Tensor
    lora_b: torch.Tensor

    def __init__(self, base: torch.nn.Embedding, a: torch.Tensor, b: torch.Tensor, scale: float, selection: Selection):
        super().__init__()
        self.base, self.scale, self.selection = base, scale, selection
        self.register_buffer("lora_a", a, persistent=False)  # (tasks, rows, rank)
        self.register_buffer("lora_b", b, persistent=False)  # (tasks, rank, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.base(ids)
        task = self.selection.task
        if task is None:
            return out
        return out + self.scale * (functional.embedding(ids, self.lora_a[task]) @ self.lora_b[task])


def read_factors(path: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The published layer name (`encoder.layers.0.mixer.Wqkv`) -> its stacked (A, B) factors."""
    from safetensors.torch import load_file

    if not path.is_file():
        raise ModelUnavailable(f"jina-embeddings-v3's task adapters are missing: no {path.name} in {path.parent}")
    stored = load_file(str(path))
    layers = {name.removeprefix("roberta.").split(_SUFFIX)[0] for name in stored}
    factors = {}
    for layer in sorted(layers):
        pair = [stored.get(f"{prefix}{layer}{_SUFFIX}{part}") for part in "AB" for prefix in ("roberta.", "")]
        a, b = [t for t in pair[:2] if t is not None], [t for t in pair[2:] if t is not None]
        if len(a) != 1 or len(b) != 1:
            raise ModelUnavailable(f"jina-embeddings-v3's adapter of {layer} lacks its lora_A or lora_B")
        factors[layer] = (a[0], b[0])
    return factors


def targets(model: Any, layer: str) -> list[tuple[Any, str, int]]:
    """The port's modules that carry `layer`'s adapter: (parent, attribute, part of B's rows)."""
    if layer in ("embeddings.word_embeddings", "embeddings.token_type_embeddings"):
        return [(model.embeddings, layer.split(".")[1], 0)]
    if layer == "pooler.dense":  # adapted in the checkpoint; pooled by mean, it is never run here
        return [(model.pooler, "dense", 0)] if model.pooler is not None else []
    match = _LAYER.fullmatch(layer)
    if match is None or int(match.group(1)) >= len(model.layers):
        raise ModelUnavailable(f"jina-embeddings-v3 checkpoint adapts '{layer}', a layer this server does not know")
    found = []
    for part, path in enumerate(_PORT[match.group(2)]):
        parent, _, name = path.rpartition(".")
        found.append((model.layers[int(match.group(1))].get_submodule(parent), name, part))
    return found


def install(
    model: Any, factors: dict[str, tuple[torch.Tensor, torch.Tensor]], shape: tuple[int, int], scale: float
) -> Selection:
    """Wrap every adapted layer of the port's `model` with its factors; refuse a checkpoint whose
    adapters leave a layer of the encoder out or do not fit it. `shape` is (tasks, rank)."""
    selection = Selection()
    for layer, (a, b) in factors.items():
        found = targets(model, layer)
        for parent, name, part in found:
            base = getattr(parent, name)
            rows = b.shape[1] // len(found)
            chunk = b[:, part * rows : (part + 1) * rows] if isinstance(base, torch.nn.Linear) else b
            setattr(parent, name, _wrapped(layer, base, a, chunk, shape, scale, selection))
    plain = [n for n, m in model.named_modules() if type(m) in (torch.nn.Linear, torch.nn.Embedding)]
    plain = [n for n in plain if not n.endswith(".base") and not n.startswith("pooler.")]
    if plain:
        raise ModelUnavailable(f"jina-embeddings-v3 checkpoint without task adapters for {', '.join(plain[:5])}")
    return selection


def _wrapped(
    layer: str, base: Any, a: torch.Tensor, b: torch.Tensor, shape: tuple[int, int], scale: float, selection: Selection
) -> torch.nn.Module:
    weight = base.weight
    a, b = a.to(weight.device, weight.dtype), b.to(weight.device, weight.dtype)
    if isinstance(base, torch.nn.Embedding):
        expected = [(*shape[:1], weight.shape[0], shape[1]), (shape[0], shape[1], weight.shape[1])]
        if [tuple(a.shape), tuple(b.shape)] == expected:
            return LoraEmbedding(base, a, b, scale, selection)
    elif [tuple(a.shape), tuple(b.shape)] == [(*shape, weight.shape[1]), (shape[0], weight.shape[0], shape[1])]:
        return LoraLinear(base, a, b, scale, selection)
    raise ModelUnavailable(
        f"jina-embeddings-v3's adapter of {layer} has factors {tuple(a.shape)} and {tuple(b.shape)}, which do not "
        f"fit its weight {tuple(weight.shape)} with {shape[0]} tasks of rank {shape[1]}"
    )


@dataclass(frozen=True)
class TaskBatch(TextBatch):
    """A text batch of one task (its index in `lora_adaptations`; None: no adapter)."""

    task: int | None = None


class JinaLoraAdapter(DenseAdapter):
    """A dense embedder whose batches run with their task's LoRA adapter (jina-embeddings-v3)."""

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        super().__init__(layout, trust_remote_code)
        config = layout.config
        self.tasks = tuple(str(t) for t in config.get("lora_adaptations") or ())
        instructions = config.get("task_instructions") or {}
        self.task_prompts = {t: str(instructions.get(t) or "") for t in self.tasks}
        self.default_task = _default_task(layout, self.tasks)
        self.rank, self.alpha = int(config.get("lora_rank", 4)), float(config.get("lora_alpha", 1))
        self.selection = Selection()
        self._forwarding = threading.Lock()

    def new_engine(self, options: LoadOptions, device: str) -> Engine:
        if options.backend not in ("torch", "auto"):
            raise ModelUnavailable(
                f"jina-embeddings-v3's task adapters run on the torch engine only, not {options.backend}: "
                "set backend: torch (or auto)"
            )
        self.choice = Choice("torch", "jina-embeddings-v3's task adapters run on torch")
        return create_engine("torch")

    def load(self, options: LoadOptions) -> None:
        jina_weights(self.layout.transformer_dir)
        super().load(options)
        engine = self.engine
        assert isinstance(engine, backend.TorchEngine), "This is a bug: jina-embeddings-v3 loaded on another engine"
        factors = read_factors(self.layout.transformer_dir / LORA_FILE)
        before = engine.footprint()
        self.selection = install(engine.model, factors, (len(self.tasks), self.rank), self.alpha / self.rank)
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
        return TaskBatch(text.inputs, text.attention_mask, text.pool_mask, text.spans, task)

    def forward(self, batch: TextBatch) -> torch.Tensor:
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
