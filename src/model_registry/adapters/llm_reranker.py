"""LLM rerankers in their original format: a causal LM scores a (query, document) pair by its
next token after a prompt (Qwen3-Reranker, bge-reranker-v2-gemma, mxbai-rerank-v2).

The prompt and the scoring tokens come from detection (`zoo.rerank_templates.RerankPrompt`). The pair is
rendered into the prompt's pieces, each tokenized on its own and their ids joined as the family's
reference joins them (the pieces write their own special tokens); a chat template renders one
text. The engine runs the base model and the LM head's rows of the two tokens only, at each
sequence's last real token: p(true) = softmax([logit_false, logit_true])[1] = sigmoid(logit_true -
logit_false), and the log-odds `logit_true - logit_false` are the raw score (with no false token,
sigmoid of the true token's logit, which is the raw score). torch only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from model_registry.adapters.base import LoadOptions
from model_registry.adapters.dense import TextEncoder, as_tensor
from model_registry.adapters.engines import engine_for
from model_registry.adapters.text import pad
from model_registry.backends.base import EncoderBatch, EngineOptions, Task
from model_registry.backends.choice import Choice
from model_registry.detection.layout import Layout
from model_registry.errors import InputTooLong, InvalidInput, ModelUnavailable, UnsupportedOperation
from model_registry.types import Capability, Item, Kind, PairItem, Prepared, Result, Score
from model_registry.zoo.rerank_templates import CHAT_TEMPLATE, RerankPrompt, parse

#: Patterns by which sentence-transformers tells a chat template that takes structured content
#: (a list of typed parts) from one that takes a plain string.
_STRUCTURED = ("content[0]", ".type", "'type'", '"type"', "item.type", "message.content[")


@dataclass(frozen=True)
class PromptBatch:
    inputs: EncoderBatch


class LlmRerankerAdapter(TextEncoder):
    """One probability per (query, document) pair from a causal LM's yes/no logits."""

    kind = Kind.RERANKER
    capabilities = frozenset({Capability.RERANK})
    task: Task = "causal-lm"
    truncation_sides = ("right",)
    token_caps = False
    rerank_instructions = True

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        super().__init__(layout, trust_remote_code)
        if layout.rerank_prompt is None:
            raise ModelUnavailable("This is a bug: an LLM reranker was created without its prompt")
        self.prompt: RerankPrompt = layout.rerank_prompt
        self.rows: tuple[int, ...] = ()

    def load(self, options: LoadOptions) -> None:
        self.load_model(options)

    def engine_choices(self, options: LoadOptions, device: str) -> tuple[Choice, ...]:
        """torch: only its engine computes two rows of the LM head. An explicit other engine is
        refused by the engine check, naming torch."""
        if options.backend != "auto":
            self.choice = engine_for(str(self.layout.root), options, self.layout, device.startswith("cuda"))
        else:
            self.choice = Choice("torch", "auto: torch, the only engine that serves LLM rerankers")
        return (self.choice,)

    def engine_options(self, options: LoadOptions, device: str) -> EngineOptions:
        """The engine's options with the scoring tokens' rows, once the tokenizer is read (`build`
        runs before it and loads nothing on torch)."""
        base = super().engine_options(options, device)
        self.rows = self._token_rows() if self.tokenizer is not None else ()
        return dataclasses.replace(base, rows=self.rows)

    def _token_rows(self) -> tuple[int, ...]:
        tokens = [self.prompt.true_token] + ([self.prompt.false_token] if self.prompt.false_token else [])
        return tuple(self._token_id(token) for token in tokens)

    def _token_id(self, token: str) -> int:
        """A vocabulary entry, else a text that the tokenizer encodes as exactly one token."""
        assert self.tokenizer is not None
        vocabulary = self.tokenizer.tokenizer.get_vocab()
        if token in vocabulary:
            return int(vocabulary[token])
        ids = self.tokenizer.ids([token], special=False, cut=None)[0]
        if len(ids) != 1:
            raise ModelUnavailable(
                f"the scoring token {token!r} is {len(ids)} tokens in this model's tokenizer, not one; "
                "set `true_token` and `false_token` to single tokens of its vocabulary"
            )
        return ids[0]

    # ---- prompts ------------------------------------------------------------------------------

    def render(self, query: str, document: str, instruction: str | None) -> list[str]:
        """The pair's texts, each tokenized on its own."""
        if self.prompt.pieces is not None:
            return self.prompt.render(query, document, instruction)
        return [self._chat(query, document, self.prompt.instruction if instruction is None else instruction)]

    def _chat(self, query: str, document: str, instruction: str) -> str:
        """The pair as sentence-transformers 6 renders it: `query` and `document` messages (a
        system message with the instruction first, as its prompt), through the chat template."""
        assert self.tokenizer is not None
        wrapper = self.tokenizer.tokenizer
        template = str(wrapper.chat_template)
        structured = any(pattern in template for pattern in _STRUCTURED)
        parts = [("system", instruction)] if instruction else []
        parts += [("query", query), ("document", document)]
        messages: Any = [
            {"role": role, "content": [{"type": "text", "text": text}] if structured else text} for role, text in parts
        ]
        return str(wrapper.apply_chat_template(messages, tokenize=False))

    def _check_instruction(self, items: Sequence[PairItem]) -> None:
        if self.prompt.template is None or any(name == "instruction" for _, name in parse(self.prompt.template)):
            return
        if any(item.instruction is not None for item in items):
            raise InvalidInput(
                f"this model's prompt ({self.prompt.origin}) has no {{instruction}}; send no instruction",
                param="instruction",
            )

    # ---- stages -------------------------------------------------------------------------------

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        pairs = []
        for item in items:
            if not isinstance(item, PairItem):
                raise UnsupportedOperation(
                    f"a reranker scores (query, document) pairs; it cannot take {type(item).__name__}"
                )
            pairs.append(item)
        self._check_instruction(pairs)
        encoded = [self._fit(i, pair) for i, pair in enumerate(pairs)]
        return [Prepared(i, len(ids), len(ids), ids) for i, ids in enumerate(encoded)]

    def _encode(self, texts: list[str]) -> list[int]:
        """The pieces' token ids, joined."""
        assert self.tokenizer is not None, "This is a bug: prepare() called before load()"
        return [token for ids in self.tokenizer.ids(texts, special=False, cut=None) for token in ids]

    def _fit(self, index: int, pair: PairItem) -> tuple[int, ...]:
        """The pair's prompt as token ids; over the limit, its document keeps its first tokens
        (then the query too, when the query alone leaves no room), the prompt's frame whole."""
        assert self.tokenizer is not None
        limit = self.tokenizer.max_length
        query, document = pair.query, pair.document
        ids = self._encode(self.render(query, document, pair.instruction))
        if len(ids) <= limit:
            return tuple(ids)
        if not pair.truncate:
            raise InputTooLong(
                f"document {index} and the query make a prompt of {len(ids)} tokens, more than the model's limit "
                f"of {limit}; shorten it or allow truncation",
                param="documents",
            )
        frame = len(self._encode(self.render(query, "", pair.instruction)))
        if frame >= limit:  # the query alone leaves no room: it keeps half of what the frame leaves
            empty = len(self._encode(self.render("", "", pair.instruction)))
            query = self.tokenizer.first_tokens([query], max(1, (limit - empty) // 2))[0]
            frame = len(self._encode(self.render(query, "", pair.instruction)))
        room = max(1, limit - frame)
        while True:  # a cut can change how the text's edge joins the frame: cut again by the excess
            document = self.tokenizer.first_tokens([document], room)[0]
            ids = self._encode(self.render(query, document, pair.instruction))
            if len(ids) <= limit or room == 1:
                return tuple(ids[:limit])
            room = max(1, room - (len(ids) - limit))

    def collate(self, items: Sequence[Prepared]) -> PromptBatch:
        assert self.tokenizer is not None, "This is a bug: collate() called before load()"
        padded = pad([p.data for p in items], self.tokenizer.pad_id, left=self.tokenizer.left_padding)
        return PromptBatch(EncoderBatch(padded.input_ids, padded.attention_mask))

    def forward(self, batch: PromptBatch) -> torch.Tensor:
        output = self.run(batch.inputs)
        with torch.inference_mode():
            result: torch.Tensor = as_tensor(output.logits).float().cpu()
            return result

    def postprocess(self, batch: PromptBatch, output: torch.Tensor) -> list[Result]:
        """log-odds of the true token against the false one (or its logit alone), and p(true)."""
        odds = (output[:, 0] - output[:, 1] if output.shape[1] == 2 else output[:, 0]).double()
        return [Score(p, logit=value) for p, value in zip(torch.sigmoid(odds).tolist(), odds.tolist(), strict=True)]

    def family_facts(self) -> dict[str, Any]:
        prompt = self.prompt
        return {
            "prompt": prompt.origin,
            "true_token": prompt.true_token,
            "false_token": prompt.false_token,
            "instruction": prompt.instruction or None,
            "scoring": "p(true) = softmax over the true and false token logits at the last token"
            if prompt.false_token
            else "sigmoid of the true token's logit at the last token",
            "chat_template": prompt.origin == CHAT_TEMPLATE,
        }
