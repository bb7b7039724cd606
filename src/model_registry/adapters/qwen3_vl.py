"""Qwen3-VL-Embedding through transformers (`Qwen3VLModel`): texts, images, and a text and an
image together (`Mixed`), each to one dense vector.

Each input is a conversation, as the model's reference code (`Qwen3VLEmbedder`) builds it: a
system message holding the instruction (the request's prompt, else the model's default "Represent
the user's input.", with a full stop added where it ends in no punctuation) and a user message
holding the image, the text, or both (the image first, then the text), rendered by the model's
chat template with the assistant's turn opened. An image is laid over white if it has alpha and
resized, its aspect kept, to sides that are multiples of the vision tower's patch x merge size
(32 px) holding between `min_pixels` and `max_pixels` (4 and 1,800 tokens' worth by default; the
entry's `options` may set others), then handed to the processor unresized. The vector is the last
real token's hidden state, L2-normalised.

An input costs its sequence length, visual tokens included, which `prepare` knows before any
forward pass; it counts so in admission, batching and the answer's usage. Texts and images share
batches, padded on the right as the reference pads them. A text longer than `max_length` (the
reference's 8,192 tokens unless the entry or the model sets fewer) is cut at its end, template
included, as the reference's processor cuts it, and so is a mixed input where the cut keeps all
of its visual tokens; an image input that long, or a mixed one whose image would be cut, is refused.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.backends.torch import engine as backend
from model_registry.backends.weights import from_pretrained_checked
from model_registry.detection.layout import Layout, read_json
from model_registry.errors import InvalidInput, ModelUnavailable, UnsupportedOperation
from model_registry.media.decoding import decode_image, media_of, processing
from model_registry.types import (
    Capability,
    Embedding,
    EmbedItem,
    Item,
    Kind,
    Media,
    MediaLimits,
    Mixed,
    Modality,
    Output,
    Prepared,
    Result,
    Text,
)

DEFAULT_INSTRUCTION = "Represent the user's input."
#: The reference's bounds: 4 and 1,800 visual tokens of 32 x 32 pixels, and its longest sequence.
MIN_PIXELS = 4 * 32 * 32
MAX_PIXELS = 1800 * 32 * 32
MAX_LENGTH = 8192
#: qwen-vl-utils' limit on an image's longer side over its shorter.
MAX_RATIO = 200


def instruction(prompt: str) -> str:
    """The system message's text for a request's prompt, as the reference code makes it."""
    text = prompt.strip()
    if not text:
        return DEFAULT_INSTRUCTION
    return text if unicodedata.category(text[-1]).startswith("P") else text + "."


def fitted_size(width: int, height: int, factor: int, least: int, most: int) -> tuple[int, int]:
    """(width, height) rounded to multiples of `factor`, then scaled, aspect kept, to hold between
    `least` and `most` pixels (qwen-vl-utils' rule)."""
    if max(width, height) / min(width, height) > MAX_RATIO:
        raise ValueError(f"the image's sides are more than {MAX_RATIO} times apart")
    down = max(factor, round(height / factor) * factor)
    across = max(factor, round(width / factor) * factor)
    if down * across > most:
        scale = math.sqrt(height * width / most)
        down = math.floor(height / scale / factor) * factor
        across = math.floor(width / scale / factor) * factor
    elif down * across < least:
        scale = math.sqrt(least / (height * width))
        down = math.ceil(height * scale / factor) * factor
        across = math.ceil(width * scale / factor) * factor
    return across, down


@dataclass(frozen=True)
class Batch:
    tensors: dict[str, torch.Tensor]
    last: torch.Tensor  # each row's last real position


def collate(items: Sequence[Prepared], pad_id: int | None, dtype: torch.dtype, device: str | None) -> Batch:
    """Prepared sequences (their `input_ids`, and where given `mm_token_type_ids` and one image's
    `pixel_values` and `image_grid_thw`) padded on the right into one batch on `device`, with
    each row's last real position."""
    longest = max(len(p.data["input_ids"]) for p in items)
    ids = np.full((len(items), longest), 0 if pad_id is None else int(pad_id), dtype=np.int64)
    mask = np.zeros((len(items), longest), dtype=np.int64)
    kinds = np.zeros((len(items), longest), dtype=np.int64)
    for row, p in enumerate(items):
        n = len(p.data["input_ids"])
        ids[row, :n], mask[row, :n] = p.data["input_ids"], 1
        if "mm_token_type_ids" in p.data:
            kinds[row, :n] = p.data["mm_token_type_ids"]
    tensors = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
    if any("mm_token_type_ids" in p.data for p in items):
        tensors["mm_token_type_ids"] = torch.from_numpy(kinds)
    pictured = [p.data for p in items if "pixel_values" in p.data]
    if pictured:
        pixels = np.concatenate([d["pixel_values"] for d in pictured])
        tensors["pixel_values"] = torch.from_numpy(pixels).to(dtype)
        tensors["image_grid_thw"] = torch.from_numpy(np.stack([d["image_grid_thw"] for d in pictured]))
    last = torch.from_numpy(mask.sum(axis=1) - 1)
    return Batch({k: v.to(device) for k, v in tensors.items()}, last)


class Qwen3VLEmbeddingAdapter(Adapter):
    kind = Kind.DENSE
    capabilities = frozenset({Capability.EMBED_TEXT, Capability.EMBED_IMAGE})
    backend = "torch"
    mixed_inputs = True

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        self.layout = layout
        self.trust_remote_code = trust_remote_code
        self.model: Any = None
        self.processor: Any = None
        self.device = "cpu"
        self.dtype = torch.float32
        self.limits = MediaLimits()
        self.normalize = True
        self.factor = 32
        self.min_pixels = MIN_PIXELS
        self.max_pixels = MAX_PIXELS
        self.prompts = dict(layout.prompts)
        self.default_prompt_name = layout.default_prompt_name
        self.similarity = layout.similarity
        self._footprint = 0

    # ---- loading ---------------------------------------------------------------------------------

    def load(self, options: LoadOptions) -> None:
        from transformers import Qwen3VLModel

        self._check_files()
        directory = self.open_processor(options)
        model = from_pretrained_checked(Qwen3VLModel, directory, "embedding", dtype=self.dtype)
        self.model = model.to(self.device).eval()
        text_config = self.model.config.text_config
        self.dimensions = int(text_config.hidden_size)
        if self.layout.truncate_dim is not None:
            self.dimensions = min(self.dimensions, self.layout.truncate_dim)
        limits = [self.layout.max_length, MAX_LENGTH, getattr(text_config, "max_position_embeddings", None)]
        self.max_length = min(n for n in limits if isinstance(n, int) and n > 0)
        # Every call asks the tokenizer for the same settings (no padding, no truncation), first
        # here, so that its wrapper never reconfigures the Rust tokenizer under a prepare thread.
        self._encode(self._render(DEFAULT_INSTRUCTION, "", image=False), None)
        self._footprint = backend.module_bytes(self.model) * 2

    def open_processor(self, options: LoadOptions) -> Path:
        """Device, precision, threads, media limits and the processor with its pixel bounds, as
        the embedder and the reranker load them; the model's directory."""
        from transformers import AutoProcessor

        self.device = backend.resolve_device(options.device)
        self.dtype = backend.resolve_dtype(options.dtype, self.device)
        backend.configure_threads(options.threads)
        self.limits = options.media
        directory = self.layout.transformer_dir
        self.processor = AutoProcessor.from_pretrained(str(directory))  # type: ignore[no-untyped-call]
        images = self.processor.image_processor
        self.factor = int(images.patch_size) * int(images.merge_size)
        self.min_pixels, self.max_pixels = self._pixel_bounds()
        return directory

    def _check_files(self) -> None:
        """Read every setting of the files that changes the vectors, or refuse the model."""
        layout = self.layout
        if layout.adapters:
            raise ModelUnavailable(f"{layout.root}: `adapters` (PEFT LoRA) are not served on Qwen3-VL-Embedding")
        if layout.dense_layers:
            raise ModelUnavailable(f"{layout.root}: a Dense module after Qwen3-VL's pooling is not served")
        has_pooling = "Pooling" in layout.modules
        if has_pooling and layout.pooling != "lasttoken":
            raise ModelUnavailable(
                f"{layout.root}: Qwen3-VL-Embedding pools its last token; the files or the entry ask for "
                f"'{layout.pooling}' pooling"
            )
        self.normalize = layout.normalize if has_pooling else True
        settings = read_json(layout.transformer_dir / "sentence_bert_config.json")
        template = dict((settings.get("processing_kwargs") or {}).get("chat_template") or {})
        if template.pop("add_generation_prompt", True) is not True or template:
            raise ModelUnavailable(
                f"{layout.transformer_dir / 'sentence_bert_config.json'}: processing_kwargs.chat_template "
                f"{settings['processing_kwargs']['chat_template']!r} is not served; Qwen3-VL-Embedding renders its "
                "chat template with the assistant's turn opened (add_generation_prompt: true) and nothing else"
            )

    def _pixel_bounds(self) -> tuple[int, int]:
        bounds = []
        for key, default in (("min_pixels", MIN_PIXELS), ("max_pixels", MAX_PIXELS)):
            value = self.layout.options.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < self.factor * self.factor:
                raise ModelUnavailable(
                    f"options.{key} must be an integer of at least {self.factor * self.factor} (one visual "
                    f"token of {self.factor} x {self.factor} pixels), got {value!r}"
                )
            bounds.append(value)
        if bounds[0] > bounds[1]:
            raise ModelUnavailable(f"options.min_pixels {bounds[0]} is more than options.max_pixels {bounds[1]}")
        return bounds[0], bounds[1]

    def unload(self) -> None:
        self.model = None
        self.processor = None

    def footprint(self) -> int:
        return self._footprint

    # ---- prepare ---------------------------------------------------------------------------------

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        prepared = []
        for index, item in enumerate(items):
            if not isinstance(item, EmbedItem):
                raise InvalidInput(f"input {index}: this model embeds inputs, it cannot take {type(item).__name__}")
            if item.outputs != {Output.DENSE}:
                raise UnsupportedOperation("this model produces dense vectors only", param="outputs")
            system = instruction(item.prompt)
            content = item.content
            if isinstance(content, Mixed):
                image = self._image(index, content.image)
                with processing(index, "image"):
                    data = self._encode(self._render(system, content.text, image=True), image)
                self._check_length(index, data, cut=item.truncate, what="the text and the image's")
            elif (media := media_of(index, item, frozenset({Modality.IMAGE}))) is not None:
                image = self._image(index, media)
                with processing(index, "image"):
                    data = self._encode(self._render(system, None, image=True), image)
                self._check_length(index, data, cut=False, what="the image's")
            else:
                if not isinstance(content, Text):
                    raise InvalidInput(f"input {index}: this model takes text, not token ids", param="input")
                data = self._encode(self._render(system, content.text, image=False), None)
                self._check_length(index, data, cut=item.truncate, what="the text's")
            length = len(data["input_ids"])
            prepared.append(Prepared(index, length, length, data))
        return prepared

    def _image(self, index: int, media: Media) -> Any:
        """The image decoded (laid over white where it has alpha) and resized as the reference resizes it."""
        image = decode_image(media.data, index, self.limits, self.resize, on_white=True)
        with processing(index, "image"):
            return image.resize(self.resize(*image.size))

    def resize(self, width: int, height: int) -> tuple[int, int]:
        """The size an image of `width` x `height` is resized to before the processor."""
        return fitted_size(width, height, self.factor, self.min_pixels, self.max_pixels)

    def _render(self, system: str, text: str | None, *, image: bool) -> str:
        """The conversation as the reference builds it: the user's message holds the image first,
        then the text (a mixed input holds both)."""
        parts: list[dict[str, str]] = [{"type": "image"}] if image else []
        if text is not None:
            parts.append({"type": "text", "text": text})
        conversation = [
            {"role": "system", "content": [{"type": "text", "text": system}]},
            {"role": "user", "content": parts},
        ]
        rendered: str = self.processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        return rendered

    def _encode(self, text: str, image: Any) -> dict[str, np.ndarray]:
        images = [image] if image is not None else None
        encoded = self.processor(text=[text], images=images, do_resize=False, return_tensors="np")
        data = {k: np.asarray(v[0]) for k, v in encoded.items() if k in ("input_ids", "mm_token_type_ids")}
        if image is not None:
            data["pixel_values"] = np.asarray(encoded["pixel_values"], dtype=np.float32)
            data["image_grid_thw"] = np.asarray(encoded["image_grid_thw"][0])
        return data

    def _check_length(self, index: int, data: dict[str, np.ndarray], *, cut: bool, what: str) -> None:
        """Cut an over-long input at its end as the reference's processor cuts it, where the cut
        keeps every visual token (a mixed input's text loses its end); refuse it otherwise."""
        length, limit = len(data["input_ids"]), self.max_length or MAX_LENGTH
        if length <= limit:
            return
        if cut and "pixel_values" in data:
            visual = np.flatnonzero(data["input_ids"] == self.processor.image_token_id)
            cut = visual.size > 0 and int(visual[-1]) < limit
        if not cut:
            raise InvalidInput(
                f"input {index}: {what} {length} tokens (the instruction and chat template included) are more than "
                f"the model's {limit}",
                param="input",
            )
        for key in ("input_ids", "mm_token_type_ids"):
            if key in data:
                data[key] = data[key][:limit]

    # ---- batches ---------------------------------------------------------------------------------

    def collate(self, items: Sequence[Prepared]) -> Batch:
        return collate(items, self.processor.tokenizer.pad_token_id, self.dtype, self.device)

    def forward(self, batch: Batch) -> np.ndarray:
        with torch.inference_mode():
            hidden = self.model(**batch.tensors).last_hidden_state
            vectors = hidden[torch.arange(hidden.shape[0], device=hidden.device), batch.last.to(hidden.device)]
            vectors = vectors.float()
            if self.normalize:
                vectors = torch.nn.functional.normalize(vectors, p=2, dim=-1)
            if self.layout.truncate_dim is not None:  # cut after the Normalize module, as saved
                vectors = vectors[:, : self.layout.truncate_dim]
            out: np.ndarray = np.ascontiguousarray(vectors.cpu().numpy(), dtype=np.float32)
            return out

    def postprocess(self, batch: Batch, output: np.ndarray) -> list[Result]:
        return [Embedding(dense=row) for row in output]

    def describe(self) -> dict[str, Any]:
        return {
            "modalities": ["text", "image"],
            "pooling": "lasttoken",
            "normalize": self.normalize,
            "default_instruction": DEFAULT_INSTRUCTION,
            "min_pixels": self.min_pixels,
            "max_pixels": self.max_pixels,
            "architectures": list(self.layout.architectures),
        }
