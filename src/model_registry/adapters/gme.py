"""GME through transformers' Qwen2-VL (`Qwen2VLModel`): texts, images, and a text and an image
together (`Mixed`, the reference's fused input), each to one dense vector.

Each input becomes one prompt, as the model's reference code (`GmeQwen2VL` in `gme_inference.py`)
writes it, without the chat template: a system turn holding the instruction (the request's prompt,
else "You are a helpful assistant."), a user turn holding the image's vision tokens, the text, or
both (the image's tokens first, then the text, as its `get_fused_embeddings` writes them), and the
assistant's turn opened and closed by `<|endoftext|>`, whose hidden state is the vector,
L2-normalised. An image, alone or with a text, is converted to RGB (alpha dropped, as the
reference's `convert("RGB")` drops it), resized, aspect kept, to sides that are multiples of 28 px
(14 px patches merged 2 x 2) holding 4 to 16,384 visual tokens' worth, then resized again by the
Qwen2-VL processor to hold `min_image_tokens` to `max_image_tokens` (the reference's 256 and
1,280; the entry's `options` may set others). The language model reads its positions as one
sequence (0, 1, 2, ...), images included, as the reference's direct call of the decoder does: no
multimodal rotary positions.

An input costs its sequence length, visual tokens included, which `prepare` knows before any
forward pass; it counts so in admission, batching and the answer's usage. Texts, images and fused
inputs share batches, padded on the right as the reference pads them. A text longer than
`max_length` (the reference's 1,800 tokens unless the entry sets fewer) is cut at its end, the
closing tokens included, as the reference's processor cuts it, and so is a fused input where the
cut keeps all of its visual tokens; an image input that long, or a fused one whose image would be
cut, is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.adapters.qwen3_vl import Batch, collate, fitted_size
from model_registry.backends.torch import engine as backend
from model_registry.backends.weights import from_pretrained_checked
from model_registry.detection.layout import Layout
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

DEFAULT_INSTRUCTION = "You are a helpful assistant."
#: The reference's bounds on an image's visual tokens (the processor's resize), and its longest sequence.
MIN_IMAGE_TOKENS = 256
MAX_IMAGE_TOKENS = 1280
MAX_LENGTH = 1800
#: The bounds of the reference's own resize before the processor's (qwen-vl-utils' defaults).
FIRST_MIN_TOKENS = 4
FIRST_MAX_TOKENS = 16384
IMAGE_TOKENS = "<|vision_start|><|image_pad|><|vision_end|>"


def prompt(instruction: str, text: str, *, image: bool) -> str:
    """One input's prompt as the reference writes it: the instruction as the system's turn, the
    image's tokens then the text as the user's, and the assistant's turn opened and ended."""
    user = (IMAGE_TOKENS if image else "") + text
    return "".join(
        (
            f"<|im_start|>system\n{instruction}<|im_end|>\n",
            f"<|im_start|>user\n{user}<|im_end|>\n",
            "<|im_start|>assistant\n<|endoftext|>",
        )
    )


class GmeAdapter(Adapter):
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
        self.factor = 28
        self.image_token_id = -1
        self.min_tokens, self.max_tokens = MIN_IMAGE_TOKENS, MAX_IMAGE_TOKENS
        self.size: dict[str, int] = {}
        self.prompts = dict(layout.prompts)
        self.default_prompt_name = layout.default_prompt_name
        self.similarity = layout.similarity
        self._footprint = 0

    # ---- loading ---------------------------------------------------------------------------------

    def load(self, options: LoadOptions) -> None:
        from transformers import AutoProcessor, Qwen2VLModel

        if self.layout.adapters:
            raise ModelUnavailable(f"{self.layout.root}: `adapters` (PEFT LoRA) are not served on GME")
        self.min_tokens, self.max_tokens = self._token_bounds()
        self.device = backend.resolve_device(options.device)
        self.dtype = backend.resolve_dtype(options.dtype, self.device)
        backend.configure_threads(options.threads)
        self.limits = options.media
        directory = self.layout.transformer_dir
        self.processor = AutoProcessor.from_pretrained(str(directory))  # type: ignore[no-untyped-call]
        images = self.processor.image_processor
        self.factor = int(images.patch_size) * int(images.merge_size)
        # The processor's own resize holds each image between the reference's token bounds.
        self.size = {
            "shortest_edge": self.min_tokens * self.factor**2,
            "longest_edge": self.max_tokens * self.factor**2,
        }
        model = from_pretrained_checked(Qwen2VLModel, directory, "embedding", dtype=self.dtype)
        self.model = model.to(self.device).eval()
        self.image_token_id = int(self.model.config.image_token_id)
        text_config = self.model.config.text_config
        self.dimensions = int(text_config.hidden_size)
        limits = [self.layout.max_length, MAX_LENGTH, getattr(text_config, "max_position_embeddings", None)]
        self.max_length = min(n for n in limits if isinstance(n, int) and n > 0)
        # Every call asks the tokenizer for the same settings (no padding, no truncation), first
        # here, so that its wrapper never reconfigures the Rust tokenizer under a prepare thread.
        self._encode(prompt(DEFAULT_INSTRUCTION, "", image=False), None)
        self._footprint = backend.module_bytes(self.model) * 2

    def _token_bounds(self) -> tuple[int, int]:
        bounds = []
        for key, default in (("min_image_tokens", MIN_IMAGE_TOKENS), ("max_image_tokens", MAX_IMAGE_TOKENS)):
            value = self.layout.options.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelUnavailable(f"options.{key} must be a positive integer (visual tokens), got {value!r}")
            bounds.append(value)
        if bounds[0] > bounds[1]:
            raise ModelUnavailable(
                f"options.min_image_tokens {bounds[0]} is more than options.max_image_tokens {bounds[1]}"
            )
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
            media = media_of(index, item, frozenset({Modality.IMAGE}))
            assert isinstance(item, EmbedItem), "This is a bug: media_of lets only EmbedItem through"
            if item.outputs != {Output.DENSE}:
                raise UnsupportedOperation("this model produces dense vectors only", param="outputs")
            data = self._sequence(index, item, media)
            length = len(data["input_ids"])
            prepared.append(Prepared(index, length, length, data))
        return prepared

    def _sequence(self, index: int, item: EmbedItem, media: Media | None) -> dict[str, np.ndarray]:
        """One input's encoded prompt: a text, an image, or both (the image's tokens first), under
        the request's instruction."""
        instruction = item.prompt if item.prompt.strip() else DEFAULT_INSTRUCTION
        content = item.content
        if isinstance(content, Mixed):
            image = self._image(index, content.image)
            with processing(index, "image"):
                data = self._encode(prompt(instruction, content.text, image=True), image)
            self._check_length(index, data, cut=item.truncate, what="the text and the image's")
        elif media is not None:
            image = self._image(index, media)
            with processing(index, "image"):
                data = self._encode(prompt(instruction, "", image=True), image)
            self._check_length(index, data, cut=False, what="the image's")
        else:
            if not isinstance(content, Text):
                raise InvalidInput(f"input {index}: this model takes text, not token ids", param="input")
            data = self._encode(prompt(instruction, content.text, image=False), None)
            self._check_length(index, data, cut=item.truncate, what="the text's")
        return data

    def _image(self, index: int, media: Media) -> Any:
        """The image decoded to RGB and given the reference's own resize (the processor's follows)."""
        image = decode_image(media.data, index, self.limits, self.resize)
        with processing(index, "image"):
            return image.resize(self.first_size(*image.size))

    def first_size(self, width: int, height: int) -> tuple[int, int]:
        """The reference's own resize of a `width` x `height` image, before the processor's."""
        least, most = FIRST_MIN_TOKENS * self.factor**2, FIRST_MAX_TOKENS * self.factor**2
        return fitted_size(width, height, self.factor, least, most)

    def resize(self, width: int, height: int) -> tuple[int, int]:
        """The size the processor hands the vision tower for a `width` x `height` image."""
        least, most = self.min_tokens * self.factor**2, self.max_tokens * self.factor**2
        return fitted_size(*self.first_size(width, height), self.factor, least, most)

    def _encode(self, text: str, image: Any) -> dict[str, np.ndarray]:
        if image is None:
            encoded = self.processor(text=[text], return_tensors="np")
        else:
            encoded = self.processor(text=[text], images=[image], size=self.size, return_tensors="np")
        data = {"input_ids": np.asarray(encoded["input_ids"][0])}
        if image is not None:
            data["pixel_values"] = np.asarray(encoded["pixel_values"], dtype=np.float32)
            data["image_grid_thw"] = np.asarray(encoded["image_grid_thw"][0])
        return data

    def _check_length(self, index: int, data: dict[str, np.ndarray], *, cut: bool, what: str) -> None:
        """Cut an over-long input at its end as the reference's processor cuts it, where the cut
        keeps every visual token (a fused input's text loses its end); refuse it otherwise."""
        length, limit = len(data["input_ids"]), self.max_length or MAX_LENGTH
        if length <= limit:
            return
        if cut and "pixel_values" in data:
            visual = np.flatnonzero(data["input_ids"] == self.image_token_id)
            cut = visual.size > 0 and int(visual[-1]) < limit
        if not cut:
            raise InvalidInput(
                f"input {index}: {what} {length} tokens (the instruction and prompt included) are more than the "
                f"model's {limit}",
                param="input",
            )
        data["input_ids"] = data["input_ids"][:limit]

    # ---- batches ---------------------------------------------------------------------------------

    def collate(self, items: Sequence[Prepared]) -> Batch:
        return collate(items, self.processor.tokenizer.pad_token_id, self.dtype, self.device)

    def forward(self, batch: Batch) -> np.ndarray:
        tensors = batch.tensors
        with torch.inference_mode():
            ids = tensors["input_ids"]
            embeds = self.model.get_input_embeddings()(ids)
            if "pixel_values" in tensors:
                visual = self.model.visual
                seen = visual(tensors["pixel_values"].to(visual.dtype), grid_thw=tensors["image_grid_thw"])
                where = (ids == self.image_token_id).unsqueeze(-1).expand_as(embeds)
                embeds = embeds.masked_scatter(where, seen.pooler_output.to(embeds.dtype))
            # No position ids: the decoder numbers each row 0, 1, 2, ... as the reference's call does.
            hidden = self.model.language_model(inputs_embeds=embeds, attention_mask=tensors["attention_mask"])
            states = hidden.last_hidden_state
            vectors = states[torch.arange(states.shape[0], device=states.device), batch.last.to(states.device)]
            vectors = torch.nn.functional.normalize(vectors.float(), p=2, dim=-1)
            out: np.ndarray = np.ascontiguousarray(vectors.cpu().numpy(), dtype=np.float32)
            return out

    def postprocess(self, batch: Batch, output: np.ndarray) -> list[Result]:
        return [Embedding(dense=row) for row in output]

    def describe(self) -> dict[str, Any]:
        return {
            "modalities": ["text", "image"],
            "pooling": "lasttoken",
            "normalize": True,
            "default_instruction": DEFAULT_INSTRUCTION,
            "min_image_tokens": self.min_tokens,
            "max_image_tokens": self.max_tokens,
            "architectures": list(self.layout.architectures),
        }
