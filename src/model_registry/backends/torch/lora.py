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

PEFT LoRA adapters are stacked the same way (`install_stacked`): the entry's adapters, one PEFT
adapter each (`read_peft`), or one PEFT adapter holding several tasks' factors keyed by task
(`read_task_peft`, jina-embeddings-v4's layout).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
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


#: The PEFT settings this server applies as PEFT does; an adapter setting any other is refused.
_PEFT_PLAIN = {"bias": "none", "fan_in_fan_out": False, "use_dora": False, "modules_to_save": None, "lora_bias": False}
_PEFT_KEY = re.compile(r"^base_model\.model\.(.+)\.lora_([AB])\.weight$")
#: A multi-task adapter's key (jina-embeddings-v4's `MultiAdapterLinear`): each task's factors.
_TASK_KEY = re.compile(r"^base_model\.model\.(.+)\.lora_([AB])\.([^.]+)\.weight$")

Factors = dict[str, tuple[torch.Tensor, torch.Tensor]]


def read_peft(name: str, directory: Path) -> tuple[Factors, float]:
    """A PEFT LoRA adapter's factors, module name (as PEFT saved it) -> (A, B), and its scale
    (lora_alpha / r, or / sqrt(r) with rsLoRA); refused where it holds what is not a plain LoRA."""
    stored, scale = _peft_files(name, directory)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in stored.items():
        match = _PEFT_KEY.match(key)
        if match is None:
            raise ModelUnavailable(f"adapter '{name}': {key} is not a LoRA factor of a linear layer")
        pairs.setdefault(match.group(1), {})[match.group(2)] = tensor
    return _paired(name, pairs, directory), scale


def read_task_peft(directory: Path, tasks: tuple[str, ...]) -> list[tuple[str, Factors, float]]:
    """One PEFT adapter holding several tasks' factors (`...lora_A.<task>.weight`), as
    jina-embeddings-v4 publishes its task adapters: (task, factors, scale) for each of `tasks`,
    refused where a task has none or a key names a task not listed."""
    stored, scale = _peft_files("task adapters", directory)
    pairs: dict[str, dict[str, dict[str, torch.Tensor]]] = {task: {} for task in tasks}
    for key, tensor in stored.items():
        match = _TASK_KEY.match(key)
        if match is None or match.group(3) not in pairs:
            known = ", ".join(tasks)
            raise ModelUnavailable(
                f"task adapters in {directory}: {key} is not a LoRA factor of one of the tasks ({known})"
            )
        module, part, task = match.groups()
        pairs[task].setdefault(module, {})[part] = tensor
    return [(task, _paired(f"task adapters ({task})", pairs[task], directory), scale) for task in tasks]


def _peft_files(name: str, directory: Path) -> tuple[dict[str, torch.Tensor], float]:
    """A PEFT LoRA adapter's stored tensors and scale, its settings checked."""
    from safetensors.torch import load_file

    config_path, weights = directory / "adapter_config.json", directory / "adapter_model.safetensors"
    if not config_path.is_file() or not weights.is_file():
        raise ModelUnavailable(
            f"adapter '{name}': {directory} is not a PEFT adapter (adapter_config.json and adapter_model.safetensors)"
        )
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if config.get("peft_type") != "LORA":
        raise ModelUnavailable(f"adapter '{name}': peft_type {config.get('peft_type')!r}; only LORA is served")
    for key, plain in _PEFT_PLAIN.items():
        if config.get(key, plain) not in (plain, [], {}):
            raise ModelUnavailable(f"adapter '{name}': {key}: {config[key]!r} is not served (only {plain!r})")
    for key in ("rank_pattern", "alpha_pattern", "layers_to_transform"):
        if config.get(key):
            raise ModelUnavailable(f"adapter '{name}': {key} is not served; merge the adapter or drop {key}")
    rank, alpha = int(config.get("r", 8)), float(config.get("lora_alpha", 8))
    scale = alpha / (rank**0.5 if config.get("use_rslora") else rank)
    return load_file(str(weights)), scale


def _paired(name: str, pairs: dict[str, dict[str, torch.Tensor]], weights: Path) -> Factors:
    factors = {}
    for module, pair in pairs.items():
        if set(pair) != {"A", "B"}:
            raise ModelUnavailable(f"adapter '{name}': {module} lacks its lora_A or lora_B")
        factors[module] = (pair["A"], pair["B"])
    if not factors:
        raise ModelUnavailable(f"adapter '{name}': no LoRA factors in {weights}")
    return factors


def install_peft(model: Any, adapters: list[tuple[str, Path]]) -> Selection:
    """The adapters' factors on `model`'s linear layers, stacked (`install_stacked`)."""
    return install_stacked(model, [(name, *read_peft(name, path)) for name, path in adapters])


def install_stacked(model: Any, read: list[tuple[str, Factors, float]]) -> Selection:
    """Adapters' factors on `model`'s linear layers, stacked: adapter i is task i, each scaled
    into its B and padded with zeros to the largest rank (a layer an adapter leaves alone gets its
    zeros). A factor that names no linear layer of `model`, or does not fit it, is refused."""
    modules = sorted({module for _, factors, _ in read for module in factors})
    selection = Selection()
    for module in modules:
        parent, attribute, base = _linear(model, module, [name for name, factors, _ in read if module in factors])
        weight = base.weight
        rank = max(factors[module][0].shape[0] for _, factors, _ in read if module in factors)
        a = torch.zeros(len(read), rank, weight.shape[1], dtype=weight.dtype, device=weight.device)
        b = torch.zeros(len(read), weight.shape[0], rank, dtype=weight.dtype, device=weight.device)
        for index, (name, factors, scale) in enumerate(read):
            if module not in factors:
                continue
            low, high = factors[module]
            if low.shape[1] != weight.shape[1] or high.shape != (weight.shape[0], low.shape[0]):
                raise ModelUnavailable(
                    f"adapter '{name}': the factors of {module}, {tuple(low.shape)} and {tuple(high.shape)}, do "
                    f"not fit its weight {tuple(weight.shape)}: an adapter of another base model"
                )
            a[index, : low.shape[0]] = low.to(weight.dtype)
            b[index, :, : low.shape[0]] = scale * high.to(weight.dtype)
        setattr(parent, attribute, LoraLinear(base, a, b, 1.0, selection))
    return selection


def _linear(model: Any, module: str, named_by: list[str]) -> tuple[Any, str, torch.nn.Linear]:
    """The linear layer PEFT's `module` names in `model`: as named, or under the model's prefix
    (a PEFT adapter of `BertForMaskedLM` names `bert.encoder...`, the encoder itself `encoder...`)."""
    for candidate in (module, module.partition(".")[2]):
        parent_name, _, attribute = candidate.rpartition(".")
        try:
            parent = model.get_submodule(parent_name) if parent_name else model
        except AttributeError:
            continue
        found = getattr(parent, attribute, None)
        if isinstance(found, torch.nn.Linear):
            return parent, attribute, found
    raise ModelUnavailable(
        f"adapter '{named_by[0]}' adapts {module}, which is not a linear layer of this model: an adapter of "
        "another base model, or of a layer other than a linear one"
    )


def merge_peft(model: Any, name: str, directory: Path, rename: Callable[[str], str]) -> int:
    """The PEFT LoRA adapter in `directory` merged into `model`'s linear weights, as PEFT's
    `merge_and_unload` merges it (W + s * B @ A, computed in float32); `rename` maps a module name
    as the adapter saved it to `model`'s. Returns the layers merged; a factor that names no linear
    layer of `model`, or does not fit it, is refused before any weight changes."""
    factors, scale = read_peft(name, directory)
    found = []
    for module, (low, high) in factors.items():
        target = model.get_submodule(rename(module)) if _has(model, rename(module)) else None
        if not isinstance(target, torch.nn.Linear):
            raise ModelUnavailable(
                f"{name}: the adapter in {directory} adapts {module}, which is not a linear layer of the base model: "
                "an adapter of another base model"
            )
        weight = target.weight
        if low.shape[1] != weight.shape[1] or high.shape != (weight.shape[0], low.shape[0]):
            raise ModelUnavailable(
                f"{name}: the adapter's factors of {module}, {tuple(low.shape)} and {tuple(high.shape)}, do not fit "
                f"its weight {tuple(weight.shape)}: an adapter of another base model (a 7B adapter on a 3B base?)"
            )
        found.append((weight, low, high))
    with torch.no_grad():
        for weight, low, high in found:
            delta = scale * (high.to(weight.device, torch.float32) @ low.to(weight.device, torch.float32))
            weight.add_(delta.to(weight.dtype))
    return len(found)


def _has(model: Any, path: str) -> bool:
    try:
        model.get_submodule(path)
    except AttributeError:
        return False
    return True
