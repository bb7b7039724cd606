"""Qwen3-VL-Reranker through transformers (`Qwen3VLForConditionalGeneration`): one probability per
(query, document) pair, the document a text or an image.

Each pair is a conversation, as the model's reference code (`Qwen3VLReranker`) builds it: a system
message asking for "yes" or "no" (`zoo.rerank_templates.QWEN3_VL_SYSTEM`) and a user message of
parts "<Instruct>: " + the instruction (the request's, else the entry's, else the model's default;
an empty one is the default), "<Query>:", the query, "\\n<Document>:", then the document's image
and its text, rendered by the model's chat template with the assistant's turn opened. Images are
prepared as Qwen3-VL-Embedding's (`adapters/qwen3_vl.py`: laid over white, resized to multiples of
32 px between `min_pixels` and `max_pixels`).

The score is the reference's: the language model's last hidden state at the last real token, times
the difference of the LM head's 'yes' and 'no' rows, is the log-odds (the raw score); its sigmoid,
p(yes) = softmax over the two logits, is the relevance. Padding is on the right and each row reads
its own last real token, so a pair scores the same alone or in a batch.

An over-long pair is cut as the reference cuts it: the sequence but its last 5 tokens (the end of
the user's turn and the opened assistant's) keeps every special token (the chat markers, an
image's visual tokens) and its first `max_length` minus that many other tokens, so the document's
text loses its end first; then the 5 tokens follow. `max_length` is the reference's 10,240 unless
the entry sets fewer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from model_registry.adapters.base import LoadOptions
from model_registry.adapters.qwen3_vl import Batch, Qwen3VLEmbeddingAdapter
from model_registry.backends.torch import engine as backend
from model_registry.backends.weights import from_pretrained_checked
from model_registry.detection.layout import Layout
from model_registry.errors import InputTooLong, ModelUnavailable, UnsupportedOperation
from model_registry.media.decoding import decode_image, processing
from model_registry.types import Capability, Item, Kind, Modality, PairItem, Prepared, Result, Score
from model_registry.zoo.rerank_templates import QWEN3_VL_SYSTEM, RerankPrompt

#: The reference's longest sequence before its last `TAIL` tokens.
MAX_LENGTH = 10240
#: "<|im_end|>", "\n", "<|im_start|>", "assistant", "\n": never cut.
TAIL = 5


class Qwen3VLRerankerAdapter(Qwen3VLEmbeddingAdapter):
    kind = Kind.RERANKER
    capabilities = frozenset({Capability.RERANK})
    rerank_instructions = True
    rerank_media = frozenset({Modality.IMAGE})

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        super().__init__(layout, trust_remote_code)
        if layout.rerank_prompt is None:
            raise ModelUnavailable("This is a bug: Qwen3-VL-Reranker was created without its prompt")
        self.prompt: RerankPrompt = layout.rerank_prompt
        self.score_row: torch.Tensor | None = None
        self.special: np.ndarray = np.zeros(0, dtype=np.int64)

    # ---- loading ---------------------------------------------------------------------------------

    def load(self, options: LoadOptions) -> None:
        from transformers import Qwen3VLForConditionalGeneration

        if self.layout.adapters:
            raise ModelUnavailable(f"{self.layout.root}: `adapters` (PEFT LoRA) are not served on Qwen3-VL-Reranker")
        directory = self.open_processor(options)
        tokenizer = self.processor.tokenizer
        vocabulary = tokenizer.get_vocab()
        missing = [t for t in (self.prompt.true_token, self.prompt.false_token) if t not in vocabulary]
        if missing or self.prompt.false_token is None:
            raise ModelUnavailable(
                f"{directory}: the tokenizer has no {' or '.join(repr(t) for t in missing)} token; Qwen3-VL-Reranker "
                "scores by the 'yes' and 'no' tokens of Qwen's vocabulary"
            )
        self.special = np.array(sorted(set(tokenizer.all_special_ids)), dtype=np.int64)
        whole = from_pretrained_checked(Qwen3VLForConditionalGeneration, directory, "reranking", dtype=self.dtype)
        head = whole.lm_head.weight.detach()
        yes, no = int(vocabulary[self.prompt.true_token]), int(vocabulary[self.prompt.false_token])
        # One row, in the model's precision, as the reference's score layer holds it.
        self.score_row = (head[yes] - head[no]).clone().to(self.device)
        self.model = whole.model.to(self.device).eval()
        del whole, head
        text_config = self.model.config.text_config
        limits = [self.layout.max_length, MAX_LENGTH]
        positions = getattr(text_config, "max_position_embeddings", None)
        if isinstance(positions, int) and positions > TAIL:
            limits.append(positions - TAIL)
        self.max_length = min(n for n in limits if isinstance(n, int) and n > 0)
        # The tokenizer's settings are asked for here first, not under a prepare thread.
        self._encode(self._conversation("", "", None, image=False), None)
        self._footprint = backend.module_bytes(self.model) * 2

    def unload(self) -> None:
        super().unload()
        self.score_row = None

    # ---- prepare ---------------------------------------------------------------------------------

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        prepared = []
        for index, item in enumerate(items):
            if not isinstance(item, PairItem):
                raise UnsupportedOperation(
                    f"a reranker scores (query, document) pairs; it cannot take {type(item).__name__}"
                )
            media = item.media
            if media is not None and media.modality != Modality.IMAGE:
                raise UnsupportedOperation(
                    f"document {index}: this model reads images and text, not {media.modality.value}",
                    param="documents",
                )
            if media is not None:
                image = decode_image(media.data, index, self.limits, self.resize, on_white=True)
                with processing(index, "image"):
                    image = image.resize(self.resize(*image.size))
                    data = self._encode(self._conversation(item.query, item.document, item.instruction, True), image)
            else:
                data = self._encode(self._conversation(item.query, item.document, item.instruction, False), None)
            self._cut(index, data, item.truncate)
            length = len(data["input_ids"])
            prepared.append(Prepared(index, length, length, data))
        return prepared

    def _conversation(self, query: str, document: str, instruction: str | None, image: bool) -> str:
        """The pair rendered by the chat template, as the reference's `format_mm_instruction`
        lays it out (an image before the document's text; no text part for an image alone)."""
        told = instruction or self.prompt.instruction
        parts: list[dict[str, Any]] = [
            {"type": "text", "text": "<Instruct>: " + told},
            {"type": "text", "text": "<Query>:"},
            {"type": "text", "text": query},
            {"type": "text", "text": "\n<Document>:"},
        ]
        if image:
            parts.append({"type": "image"})
        if document or not image:
            parts.append({"type": "text", "text": document})
        conversation = [
            {"role": "system", "content": [{"type": "text", "text": QWEN3_VL_SYSTEM}]},
            {"role": "user", "content": parts},
        ]
        rendered: str = self.processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        return rendered

    def _cut(self, index: int, data: dict[str, np.ndarray], truncate: bool) -> None:
        """The reference's cut of an over-long pair (see the module's docstring)."""
        ids = data["input_ids"]
        limit = self.max_length or MAX_LENGTH
        if len(ids) - TAIL <= limit:
            return
        if not truncate or self._specials(ids[:-TAIL]) > limit:
            raise InputTooLong(
                f"document {index} and the query make a prompt of {len(ids)} tokens, more than the model's limit "
                f"of {limit + TAIL}; shorten it or allow truncation",
                param="documents",
            )
        head = ids[:-TAIL]
        special = np.isin(head, self.special)
        budget = limit - int(special.sum())
        keep = special | (np.cumsum(~special) <= budget)
        keep = np.concatenate([keep, np.ones(TAIL, dtype=bool)])
        for key in ("input_ids", "mm_token_type_ids"):
            if key in data:
                data[key] = data[key][keep]

    def _specials(self, ids: np.ndarray) -> int:
        return int(np.isin(ids, self.special).sum())

    # ---- forward ---------------------------------------------------------------------------------

    def forward(self, batch: Batch) -> np.ndarray:
        assert self.score_row is not None, "This is a bug: forward() called before load()"
        with torch.inference_mode():
            hidden = self.model(**batch.tensors).last_hidden_state
            last = hidden[torch.arange(hidden.shape[0], device=hidden.device), batch.last.to(hidden.device)]
            odds = (last @ self.score_row.to(last.dtype)).float()
            out: np.ndarray = odds.cpu().numpy().astype(np.float64)
            return out

    def postprocess(self, batch: Batch, output: np.ndarray) -> list[Result]:
        """p(yes) = sigmoid(logit_yes - logit_no), with the log-odds as the raw score."""
        return [Score(0.5 * (1.0 + math.tanh(value / 2.0)), logit=float(value)) for value in output.tolist()]

    def describe(self) -> dict[str, Any]:
        return {
            "modalities": ["text", "image"],
            "instruction": self.prompt.instruction,
            "true_token": self.prompt.true_token,
            "false_token": self.prompt.false_token,
            "scoring": "p(yes) = softmax over the 'yes' and 'no' logits at the last token",
            "min_pixels": self.min_pixels,
            "max_pixels": self.max_pixels,
            "max_length": self.max_length,
            "architectures": list(self.layout.architectures),
        }
