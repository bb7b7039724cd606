"""nomic-embed-multimodal through transformers (`Qwen2_5_VLModel`): texts and page images to one
dense vector, as colpali-engine's `BiQwen2_5` and `BiQwen2_5_Processor` make them.

At load the base model's weights (the layout's `transformer_dir`) take the adapter's LoRA factors,
merged as PEFT's `merge_and_unload` merges them (`lora.merge_peft`): the published factors name
the modules of the transformers release colpali-engine trained with (`model.layers.N...` for the
language model), mapped here onto `Qwen2_5_VLModel`'s (`language_model.layers.N...`). The model
then counts in memory as the base alone.

A text becomes the reference's query: "Query: ", the request's prompt and the text, then one
`<|endoftext|>` (BiQwen2.5's single augmentation token). colpali-engine has no other text recipe,
so a text sent as a document is encoded so too. An image is converted to RGB (alpha dropped, as
the reference's `convert("RGB")` drops it) and read by the processor as published (its own resize:
sides that are multiples of 28 px, between its preprocessor_config.json's min and max pixels)
behind the reference's prompt `<|im_start|>user\\n<|vision_start|><|image_pad|><|vision_end|>Describe
the image.<|im_end|><|endoftext|>`. A text and an image in one input are refused: the reference
reads one or the other. The vector is the last real token's hidden state (the reference pads on
the left and takes the last position: the same token), L2-normalised; the language model reads
Qwen2.5-VL's multimodal rotary positions, as the reference's forward does.

An input costs its sequence length, visual tokens included, known in `prepare`; texts and images
share batches. A text longer than `max_length` (the entry's, else the model's positions) loses the
end of its text, keeping the prefix and the closing token; an image input that long is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.adapters.qwen3_vl import Batch, collate, fitted_size
from model_registry.backends.torch import engine as backend
from model_registry.backends.torch.lora import merge_peft
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
    MediaLimits,
    Modality,
    Output,
    Prepared,
    Result,
    Text,
)

#: BiQwen2_5_Processor's query prefix and its one augmentation token, as nomic trained it.
QUERY_PREFIX = "Query: "
QUERY_SUFFIX = "<|endoftext|>"
VISUAL_PROMPT = (
    "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe the image.<|im_end|><|endoftext|>"
)
#: Transformers 4.50's module names (those colpali-engine saved) -> `Qwen2_5_VLModel`'s; transformers
#: 5's names under `Qwen2_5_VLForConditionalGeneration` map too.
_RENAMES = (("model.language_model.", "language_model."), ("model.visual.", "visual."), ("model.", "language_model."))


def module_name(saved: str) -> str:
    """The `Qwen2_5_VLModel` module an adapter's factor names."""
    for old, new in _RENAMES:
        if saved.startswith(old):
            return new + saved.removeprefix(old)
    return saved


class NomicMultimodalAdapter(Adapter):
    kind = Kind.DENSE
    capabilities = frozenset({Capability.EMBED_TEXT, Capability.EMBED_IMAGE})
    backend = "torch"

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        self.layout = layout
        self.trust_remote_code = trust_remote_code
        self.model: Any = None
        self.processor: Any = None
        self.device = "cpu"
        self.dtype = torch.float32
        self.limits = MediaLimits()
        self.factor = 28
        self.min_pixels, self.max_pixels = 0, 0
        self.merged = 0
        self.prompts = dict(layout.prompts)
        self.default_prompt_name = layout.default_prompt_name
        self.similarity = layout.similarity
        self._footprint = 0

    # ---- loading ---------------------------------------------------------------------------------

    def load(self, options: LoadOptions) -> None:
        from transformers import Qwen2_5_VLModel, Qwen2VLProcessor

        self.device = backend.resolve_device(options.device)
        self.dtype = backend.resolve_dtype(options.dtype, self.device)
        backend.configure_threads(options.threads)
        self.limits = options.media
        # colpali-engine's processor is a Qwen2VLProcessor over the files beside the adapter.
        self.processor = Qwen2VLProcessor.from_pretrained(str(self.layout.root))
        images = self.processor.image_processor
        self.factor = int(images.patch_size) * int(images.merge_size)
        self.min_pixels, self.max_pixels = int(images.size["shortest_edge"]), int(images.size["longest_edge"])
        model = from_pretrained_checked(Qwen2_5_VLModel, self.layout.transformer_dir, "embedding", dtype=self.dtype)
        self.merged = merge_peft(model, "nomic-embed-multimodal", self.layout.root, module_name)
        if not self.merged:
            raise ModelUnavailable(f"the adapter in {self.layout.root} holds no LoRA factors")
        self.model = model.to(self.device).eval()
        text_config = self.model.config.text_config
        self.dimensions = int(text_config.hidden_size)
        limits = [self.layout.max_length, getattr(text_config, "max_position_embeddings", None)]
        self.max_length = min(n for n in limits if isinstance(n, int) and n > 0)
        # Every call asks the tokenizer for the same settings (no padding, no truncation), first
        # here, so that its wrapper never reconfigures the Rust tokenizer under a prepare thread.
        self._encode(QUERY_PREFIX + QUERY_SUFFIX, None)
        self._footprint = backend.module_bytes(self.model) * 2

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
            if media is not None:
                image = decode_image(media.data, index, self.limits, self.resize)
                with processing(index, "image"):
                    data = self._encode(VISUAL_PROMPT, image)
                self._refuse_long(index, data)
            else:
                if not isinstance(item.content, Text):
                    raise InvalidInput(f"input {index}: this model takes text, not token ids", param="input")
                data = self._query(index, item.prompt + item.content.text, cut=item.truncate)
            length = len(data["input_ids"])
            prepared.append(Prepared(index, length, length, data))
        return prepared

    def resize(self, width: int, height: int) -> tuple[int, int]:
        """The size the processor gives an image of `width` x `height`."""
        return fitted_size(width, height, self.factor, self.min_pixels, self.max_pixels)

    def _query(self, index: int, text: str, *, cut: bool) -> dict[str, np.ndarray]:
        """The text as the reference's query; an over-long one loses the end of its text (the
        prefix and the closing token kept), re-encoded until it fits: a cut can merge differently."""
        data = self._encode(QUERY_PREFIX + text + QUERY_SUFFIX, None)
        limit = self.max_length or len(data["input_ids"])
        for _ in range(4):
            excess = len(data["input_ids"]) - limit
            if excess <= 0:
                return data
            if not cut:
                break
            text = self._without_last(text, excess)
            data = self._encode(QUERY_PREFIX + text + QUERY_SUFFIX, None)
        if len(data["input_ids"]) <= limit:
            return data
        raise InvalidInput(
            f"input {index}: the text's {len(data['input_ids'])} tokens (with the query prefix) are more than the "
            f"model's {limit}",
            param="input",
        )

    def _without_last(self, text: str, tokens: int) -> str:
        offsets = self.processor.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)[
            "offset_mapping"
        ]
        keep = len(offsets) - tokens
        return text[: int(offsets[keep - 1][1])] if keep > 0 else ""

    def _encode(self, text: str, image: Any) -> dict[str, np.ndarray]:
        encoded = self.processor(text=[text], images=[image] if image is not None else None, return_tensors="np")
        data = {k: np.asarray(v[0]) for k, v in encoded.items() if k in ("input_ids", "mm_token_type_ids")}
        if image is not None:
            data["pixel_values"] = np.asarray(encoded["pixel_values"], dtype=np.float32)
            data["image_grid_thw"] = np.asarray(encoded["image_grid_thw"][0])
        return data

    def _refuse_long(self, index: int, data: dict[str, np.ndarray]) -> None:
        length, limit = len(data["input_ids"]), self.max_length
        if limit is not None and length > limit:
            raise InvalidInput(
                f"input {index}: the image's {length} tokens (the prompt included) are more than the model's {limit}",
                param="input",
            )

    # ---- batches ---------------------------------------------------------------------------------

    def collate(self, items: Sequence[Prepared]) -> Batch:
        return collate(items, self.processor.tokenizer.pad_token_id, self.dtype, self.device)

    def forward(self, batch: Batch) -> np.ndarray:
        with torch.inference_mode():
            states = self.model(**batch.tensors, use_cache=False).last_hidden_state
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
            "query_prefix": QUERY_PREFIX,
            "min_pixels": self.min_pixels,
            "max_pixels": self.max_pixels,
            "base_model": str(self.layout.transformer_dir),
            "merged_lora_layers": self.merged,
            "architectures": list(self.layout.architectures),
        }
