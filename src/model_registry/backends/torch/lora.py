"""Low-rank task adapters applied at run time: jina-embeddings-v3's LoRA, on transformers' native
jina_embeddings_v3 port.

The published checkpoint adapts every linear and embedding layer of its encoder with one low-rank
pair per task (`lora_adaptations` in config.json), scaled by s = lora_alpha / lora_rank: a linear
weight W (out, in) becomes W + s * B[t] @ A[t], an embedding table (rows, dim) W + s * A[t] @ B[t].
The base weights stay as loaded and each adapted layer adds its task's low-rank term to its
output: the merged weight's numbers, at rank/width of the layer's cost, with no copy of the model
per task. `families.ports` lays out the files (base weights, and the factors in `LORA_FILE`).

The torch engine selects a batch's task on every adapted layer before its forward pass
(`Selection`); an ONNX export takes it as the graph's `TASK_INPUT`, a 0-d int64 index into
`lora_adaptations`, or their count for the base weights alone (an adapter of zeros, `for_export`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional

from model_registry.backends.base import LORA_FILE
from model_registry.errors import ModelUnavailable

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
    """The task index every adapted layer of one model reads (None: the base weights alone); in
    an ONNX export, the graph's `TASK_INPUT` (a 0-d int64 tensor)."""

    task: int | torch.Tensor | None = None


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


def settings(config: dict[str, Any]) -> tuple[tuple[str, ...], int, float]:
    """The tasks, rank and alpha of config.json's `lora_adaptations`, `lora_rank`, `lora_alpha`."""
    tasks = tuple(str(t) for t in config.get("lora_adaptations") or ())
    return tasks, int(config.get("lora_rank", 4)), float(config.get("lora_alpha", 1))


def for_export(model: Any, directory: Path) -> Selection | None:
    """For an ONNX export of the port in `directory`: its adapters installed with one more task of
    zeros (the base weights alone), whose index the graph takes as `TASK_INPUT`; None where the
    directory carries no adapters."""
    if getattr(model.config, "model_type", None) != "jina_embeddings_v3" or not (directory / LORA_FILE).is_file():
        return None
    tasks, rank, alpha = settings(json.loads((directory / "config.json").read_text(encoding="utf-8")))
    factors = {
        layer: (torch.cat([a, torch.zeros_like(a[:1])]), torch.cat([b, torch.zeros_like(b[:1])]))
        for layer, (a, b) in read_factors(directory / LORA_FILE).items()
    }
    return install(model, factors, (len(tasks) + 1, rank), alpha / rank)
