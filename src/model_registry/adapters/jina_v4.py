"""jina-embeddings-v4 through transformers' Qwen2.5-VL (`Qwen2_5_VLModel`), its task adapters
applied per batch: texts and images to a single vector, to multi-vectors, or both.

Each input runs with one task's LoRA adapter (`EmbedItem.task`, else the entry's
`options.default_task`, else "retrieval"), carried as its `Prepared.group`, so that a batch never
mixes tasks; every task's factors are stacked on the adapted layers and the batch's task is
selected before its forward pass (`backends/torch/lora.py`), as the published `MultiAdapterLinear`
selects its `task_label`. A text is tokenized as its prompt ("Query: ", else "Passage: " for a
passage; text-matching's texts take "Query: " whatever their role) and the text, without a chat
template; an image as the published prompt (`IMAGE_PROMPT`), its pad token expanded to the image's
visual tokens by the Qwen2.5-VL processor, which resizes it between the processor's min and max
pixels. The decoder's last hidden state (after its final norm) gives both outputs:

- dense: the mean over a text's tokens, or over an image's tokens from `<|vision_start|>` to
  `<|vision_end|>`, L2-normalised; `dimensions` cuts it and normalises again, as the reference's
  `truncate_dim` does;
- multivector: `multi_vector_projector` (with the task's adapter) on every token, L2-normalised,
  the rows of real tokens only.

An input costs its sequence length, visual tokens included, which `prepare` knows before any
forward pass; it counts so in admission, batching and the answer's usage. A text longer than
`max_length` (the reference's 32,768 tokens unless the entry sets fewer) is cut at its end, as
the reference's processor cuts it; an image input that long is refused.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.adapters.qwen3_vl import Batch, collate, fitted_size
from model_registry.backends.torch import engine as backend
from model_registry.backends.torch import lora
from model_registry.backends.weights import from_pretrained_checked
from model_registry.detection.layout import Layout
from model_registry.errors import InvalidInput, ModelUnavailable, UnsupportedOperation
from model_registry.families.jina_v4 import (
    ADAPTERS,
    DEFAULT_TASK,
    MAX_LENGTH,
    PASSAGE,
    QUERY,
    SYMMETRIC,
    check_config,
)
from model_registry.media.decoding import decode_image, media_of, processing
from model_registry.types import (
    Capability,
    Embedding,
    EmbedItem,
    Item,
    Kind,
    MediaLimits,
    Modality,
    Output,
    Prepared,
    Result,
    Text,
)

IMAGE_PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe the image.<|im_end|>\n"
_OUTPUTS = frozenset({Output.DENSE, Output.MULTIVECTOR})
#: transformers' renames of Qwen2.5-VL's modules before 4.52 (its checkpoint conversion mapping),
#: for an adapter saved against the older layout.
_OLD_NAMES = (
    (re.compile(r"^visual\."), "model.visual."),
    (re.compile(r"^model\.(?!language_model\.|visual\.)"), "model.language_model."),
)


@dataclass(frozen=True)
class Encoded:
    """One prepared input: its processor arrays, the tokens its vector averages and its outputs."""

    arrays: dict[str, np.ndarray]
    pooled: tuple[int, int]
    outputs: frozenset[Output]


@dataclass(frozen=True)
class TaskBatch:
    batch: Batch
    task: int
    pooled: torch.Tensor  # (rows, positions): 1 where a row's vector averages the token
    lengths: tuple[int, ...]
    outputs: tuple[frozenset[Output], ...]


@dataclass(frozen=True)
class Vectors:
    dense: np.ndarray | None
    multivector: np.ndarray | None


class Published(torch.nn.Module):
    """The published module layout the adapter's names refer to: the Qwen2.5-VL model as `model`
    and the projector beside it."""

    def __init__(self, model: Any, projector: torch.nn.Linear) -> None:
        super().__init__()
        self.model = model
        self.multi_vector_projector = projector


def published_name(module: str) -> str:
    """An adapter's module name in the layout of transformers 4.52 and later."""
    for pattern, replacement in _OLD_NAMES:
        module = pattern.sub(replacement, module, count=1)
    return module


class JinaV4Adapter(Adapter):
    kind = Kind.DENSE
    capabilities = frozenset({Capability.EMBED_TEXT, Capability.EMBED_IMAGE, Capability.MULTIVECTOR})
    backend = "torch"

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        self.layout = layout
        self.trust_remote_code = trust_remote_code
        self.model: Any = None
        self.processor: Any = None
        self.device = "cpu"
        self.dtype = torch.float32
        self.limits = MediaLimits()
        self.factor, self.min_pixels, self.max_pixels = 28, 0, 0
        self.settings = check_config(layout.root, layout.config)
        self.tasks = self.settings.tasks
        #: A cut every dense vector gets: config.json's `truncate_dim`, else sentence-transformers'.
        self.cut = self.settings.truncate_dim or layout.truncate_dim
        self.default_task = _default_task(layout, self.tasks)
        self.prompts = {**layout.prompts, "query": QUERY, "passage": PASSAGE}
        self.default_prompt_name = "query"  # the reference's default prompt_name
        self.task_prompts = dict.fromkeys(self.tasks, QUERY)
        self.selection = lora.Selection()
        self._forwarding = threading.Lock()
        self._footprint = 0

    # ---- loading ---------------------------------------------------------------------------------

    def load(self, options: LoadOptions) -> None:
        from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor

        directory = self.layout.transformer_dir
        self.device = backend.resolve_device(options.device)
        self.dtype = backend.resolve_dtype(options.dtype, self.device)
        backend.configure_threads(options.threads)
        self.limits = options.media
        self.processor = Qwen2_5_VLProcessor.from_pretrained(str(directory))
        self._image_bounds(self.processor.image_processor)
        full = from_pretrained_checked(Qwen2_5_VLForConditionalGeneration, directory, "embedding", dtype=self.dtype)
        width = int(full.config.text_config.hidden_size)
        projector = read_projector(directory, width, self.settings.projected, self.dtype)
        published = Published(full.model, projector).to(self.device).eval()
        read = lora.read_task_peft(directory / ADAPTERS, self.tasks)
        renamed = [(task, {published_name(m): f for m, f in factors.items()}, s) for task, factors, s in read]
        self.selection = lora.install_stacked(published, renamed)
        self.model = published
        self.vision_start = int(full.config.vision_start_token_id)
        self.vision_end = int(full.config.vision_end_token_id)
        self.dimensions = min(self.cut or width, width)
        limits = [self.layout.max_length, MAX_LENGTH, getattr(full.config.text_config, "max_position_embeddings", None)]
        self.max_length = min(n for n in limits if isinstance(n, int) and n > 0)
        # Every call asks the tokenizer for the same settings (no padding, no truncation), first
        # here, so that its wrapper never reconfigures the Rust tokenizer under a prepare thread.
        self._encode(QUERY, None)
        self._footprint = backend.module_bytes(self.model) * 2

    def _image_bounds(self, images: Any) -> None:
        self.factor = int(images.patch_size) * int(images.merge_size)
        size = dict(getattr(images, "size", None) or {})
        self.min_pixels = int(getattr(images, "min_pixels", None) or size["shortest_edge"])
        self.max_pixels = int(getattr(images, "max_pixels", None) or size["longest_edge"])

    def unload(self) -> None:
        self.model = None
        self.processor = None

    def footprint(self) -> int:
        return self._footprint

    # ---- prepare ---------------------------------------------------------------------------------

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        prepared = []
        for index, item in enumerate(items):
            media = media_of(index, item, frozenset({Modality.IMAGE}))
            assert isinstance(item, EmbedItem), "This is a bug: media_of lets only EmbedItem through"
            if not item.outputs or not item.outputs <= _OUTPUTS:
                raise UnsupportedOperation("this model produces dense vectors and multi-vectors", param="outputs")
            task = self._task(index, item)
            if media is not None:
                image = decode_image(media.data, index, self.limits, self.resize)
                with processing(index, "image"):
                    arrays = self._encode(IMAGE_PROMPT, image)
                span = self._vision_span(index, arrays)
            else:
                if not isinstance(item.content, Text):
                    raise InvalidInput(f"input {index}: this model takes text, not token ids", param="input")
                arrays = self._encode(self._prompt(item, task) + item.content.text, None)
                span = (0, self._cut(index, arrays, cut=item.truncate))
            length = len(arrays["input_ids"])
            prepared.append(Prepared(index, length, length, Encoded(arrays, span, item.outputs), task))
        return prepared

    def _task(self, index: int, item: EmbedItem) -> str:
        task = item.task or self.default_task
        if task not in self.tasks:
            raise InvalidInput(
                f"input {index}: unknown task '{task}'; use one of {', '.join(self.tasks)}", param="task"
            )
        return task

    def _prompt(self, item: EmbedItem, task: str) -> str:
        """The request's prompt, but text-matching's: its texts take the query prompt whatever
        their role, as the reference gives every text-matching text "Query"."""
        return QUERY if task == SYMMETRIC and item.prompt == PASSAGE else item.prompt

    def resize(self, width: int, height: int) -> tuple[int, int]:
        """The size the processor hands the vision tower for a `width` x `height` image."""
        return fitted_size(width, height, self.factor, self.min_pixels, self.max_pixels)

    def _encode(self, text: str, image: Any) -> dict[str, np.ndarray]:
        images = [image] if image is not None else None
        encoded = self.processor(text=[text], images=images, return_tensors="np")
        arrays = {k: np.asarray(encoded[k][0]) for k in ("input_ids", "mm_token_type_ids") if k in encoded}
        if image is not None:
            arrays["pixel_values"] = np.asarray(encoded["pixel_values"], dtype=np.float32)
            arrays["image_grid_thw"] = np.asarray(encoded["image_grid_thw"][0])
        return arrays

    def _vision_span(self, index: int, arrays: dict[str, np.ndarray]) -> tuple[int, int]:
        """The image's tokens, `<|vision_start|>` to `<|vision_end|>` included; an image longer
        than the model takes is refused (its tokens cannot be cut)."""
        ids, limit = arrays["input_ids"], self.max_length or MAX_LENGTH
        if len(ids) > limit:
            raise InvalidInput(
                f"input {index}: the image's {len(ids)} tokens (its prompt included) are more than the model's {limit}",
                param="input",
            )
        start, end = np.flatnonzero(ids == self.vision_start), np.flatnonzero(ids == self.vision_end)
        return int(start[0]), int(end[0]) + 1

    def _cut(self, index: int, arrays: dict[str, np.ndarray], *, cut: bool) -> int:
        """An over-long text cut at its end, as the reference's processor cuts it (refused when the
        request says not to truncate); its length."""
        length, limit = len(arrays["input_ids"]), self.max_length or MAX_LENGTH
        if length <= limit:
            return length
        if not cut:
            raise InvalidInput(
                f"input {index}: the text's {length} tokens (the prompt included) are more than the model's {limit}",
                param="input",
            )
        for key in ("input_ids", "mm_token_type_ids"):
            if key in arrays:
                arrays[key] = arrays[key][:limit]
        return limit

    # ---- batches ---------------------------------------------------------------------------------

    def collate(self, items: Sequence[Prepared]) -> TaskBatch:
        group = items[0].group
        assert all(p.group == group for p in items), "This is a bug: a batch mixes tasks"
        encoded: list[Encoded] = [p.data for p in items]
        batch = collate(
            [replace(p, data=e.arrays) for p, e in zip(items, encoded, strict=True)],
            self.processor.tokenizer.pad_token_id,
            self.dtype,
            self.device,
        )
        pooled = torch.zeros(batch.tensors["input_ids"].shape, dtype=torch.float32)
        for row, e in enumerate(encoded):
            pooled[row, e.pooled[0] : e.pooled[1]] = 1.0
        lengths = tuple(len(e.arrays["input_ids"]) for e in encoded)
        outputs = tuple(e.outputs for e in encoded)
        return TaskBatch(batch, self.tasks.index(group), pooled.to(self.device), lengths, outputs)

    def forward(self, batch: TaskBatch) -> Vectors:
        wanted = frozenset().union(*batch.outputs)
        with self._forwarding, torch.inference_mode():  # the selection is read by the layers during this pass
            self.selection.task = batch.task
            hidden = self.model.model(**batch.batch.tensors).last_hidden_state
            dense = self._pooled(hidden, batch.pooled) if Output.DENSE in wanted else None
            multi = None
            if Output.MULTIVECTOR in wanted:
                projected = self.model.multi_vector_projector(hidden).float()
                multi = torch.nn.functional.normalize(projected, p=2, dim=-1).cpu().numpy()
        return Vectors(dense, multi)

    def _pooled(self, hidden: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
        """Each row's mean over its pooled tokens, L2-normalised; cut to the files' `truncate_dim`
        and normalised again where they set one, as the reference cuts by default."""
        states = hidden.float()
        mean = (states * mask.unsqueeze(-1)).sum(dim=1) / mask.sum(dim=1, keepdim=True)
        vectors = torch.nn.functional.normalize(mean, p=2, dim=-1)
        if self.cut is not None:
            vectors = torch.nn.functional.normalize(vectors[:, : self.cut], p=2, dim=-1)
        out: np.ndarray = np.ascontiguousarray(vectors.cpu().numpy(), dtype=np.float32)
        return out

    def postprocess(self, batch: TaskBatch, output: Vectors) -> list[Result]:
        results: list[Result] = []
        for row, (length, wanted) in enumerate(zip(batch.lengths, batch.outputs, strict=True)):
            dense = output.dense[row] if output.dense is not None and Output.DENSE in wanted else None
            multi = None
            if output.multivector is not None and Output.MULTIVECTOR in wanted:
                multi = np.ascontiguousarray(output.multivector[row, :length], dtype=np.float32)
            results.append(Embedding(dense=dense, multivector=multi))
        return results

    def describe(self) -> dict[str, Any]:
        return {
            "modalities": ["text", "image"],
            "pooling": "mean",
            "normalize": True,
            "scoring": "cosine (dense), maxsim (multivector)",
            "tasks": list(self.tasks),
            "default_task": self.default_task,
            "multivector_dimensions": self.settings.projected,
            "matryoshka_dimensions": list(self.settings.matryoshka_dims),
            "min_pixels": self.min_pixels,
            "max_pixels": self.max_pixels,
            "architectures": list(self.layout.architectures),
        }


def _default_task(layout: Layout, tasks: tuple[str, ...]) -> str:
    """The entry's `options.default_task`, else "retrieval" (the published code's default task)."""
    chosen = layout.options.get("default_task", DEFAULT_TASK)
    if chosen not in tasks:
        raise ModelUnavailable(f"options.default_task '{chosen}' is not one of this model's tasks: {', '.join(tasks)}")
    return str(chosen)


def read_projector(directory: Path, width: int, projected: int, dtype: torch.dtype) -> torch.nn.Linear:
    """`multi_vector_projector` (weight and bias) from the model's safetensors files."""
    from safetensors import safe_open

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    found: dict[str, torch.Tensor] = {}
    for name in files:
        with safe_open(str(directory / name), framework="pt") as opened:
            for part in ("weight", "bias"):
                if f"multi_vector_projector.{part}" in opened.keys():  # noqa: SIM118 (safe_open has no __contains__)
                    found[part] = opened.get_tensor(f"multi_vector_projector.{part}")
    if set(found) != {"weight", "bias"} or tuple(found["weight"].shape) != (projected, width):
        raise ModelUnavailable(
            f"{directory}: jina-embeddings-v4's multi_vector_projector (weight {projected} x {width} and bias) is not "
            "in its weights: the files are incomplete, or not jina-embeddings-v4's"
        )
    projector = torch.nn.Linear(width, projected, dtype=dtype)
    with torch.no_grad():
        projector.weight.copy_(found["weight"])
        projector.bias.copy_(found["bias"])
    return projector
