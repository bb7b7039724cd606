"""How an LLM reranker in its original format reads a (query, document) pair: the prompt it was
trained on and the tokens whose logits score it.

A causal LM served with `kind: reranker` scores a pair by its next-token prediction after the
prompt: p(true) = softmax over the logits of the true and false tokens at the last position
(sigmoid of the true token's logit where a model has no false token). The prompt comes from, in
order: the model entry's `template` (a template string, or the name of a record below); the
model's own chat template where it renders the `query` and `document` roles (as
sentence-transformers 6 formats a pair for a causal LM); the record for the model's layout. The
entry's `true_token`, `false_token` and `instruction` override any of them.

Nothing here imports torch or reads weights: detection resolves the prompt from the files.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from model_registry.errors import ModelUnavailable

FIELDS = ("instruction", "query", "document")
CHAT_TEMPLATE = "chat template"
_ROLE = re.compile(r"""["'](query|document)["']""")


@dataclass(frozen=True)
class RerankPrompt:
    """Where the prompt comes from (`origin`), its pieces (None: the tokenizer's chat template with
    query/document roles), the scoring tokens (no `false_token`: the true token's logit alone), the
    instruction used when a request gives none, and how a non-empty instruction fills the
    template's {instruction} (a record whose instruction line appears only when there is one).

    Each piece is tokenized on its own and the token ids are joined, as the reference code of each
    record builds its input (a tokenizer that merges punctuation with a following newline splits
    the joined text differently); a configured `template` is one piece."""

    origin: str
    pieces: tuple[str, ...] | None
    true_token: str
    false_token: str | None
    instruction: str = ""
    instruction_format: str = "{}"

    @property
    def template(self) -> str | None:
        return None if self.pieces is None else "".join(self.pieces)

    def render(self, query: str, document: str, instruction: str | None) -> list[str]:
        """The texts of one pair's pieces, to be tokenized one by one (template rerankers; chat
        templates render in the adapter)."""
        assert self.pieces is not None, "This is a bug: a chat-template prompt has no text template"
        given = self.instruction if instruction is None else instruction
        values = {
            "instruction": self.instruction_format.format(given) if given else "",
            "query": query,
            "document": document,
        }
        return ["".join(text + (values[name] if name else "") for text, name in parse(p)) for p in self.pieces]


_QWEN3 = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n',
    "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",
    "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
)
_MXBAI = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\n",
    "{instruction}query: {query}",
    "\n",
    "document: {document}",
    "\n",
    "You are a search relevance expert who evaluates how well documents match search queries. For each "
    "query-document pair, carefully analyze the semantic relationship between them, then provide your binary "
    "relevance judgment (0 for not relevant, 1 for relevant).\nRelevance:",
    "<|im_end|>\n<|im_start|>assistant\n",
)
_GEMMA = ("<bos>", "A: {query}", "\n", "B: {document}", "\n", "{instruction}")
_GEMMA_INSTRUCTION = (
    "Given a query A and a passage B, determine whether the passage contains an answer to the query by "
    "providing a prediction of either 'Yes' or 'No'."
)

#: The published layouts, pieced as their reference code tokenizes a pair: Qwen3-Reranker's model
#: card (prefix, body, suffix), FlagEmbedding's `FlagLLMReranker` (bos, "A: " query, "\n",
#: "B: " passage, "\n", prompt) and the mxbai-rerank package's `MxbaiRerankV2` (chat prefix,
#: instruction line and query, "\n", document, "\n", task, chat suffix).
RECORDS: dict[str, RerankPrompt] = {
    "qwen3-reranker": RerankPrompt(
        "qwen3-reranker",
        _QWEN3,
        "yes",
        "no",
        "Given a web search query, retrieve relevant passages that answer the query",
    ),
    "bge-reranker-v2-gemma": RerankPrompt("bge-reranker-v2-gemma", _GEMMA, "Yes", None, _GEMMA_INSTRUCTION),
    "mxbai-rerank-v2": RerankPrompt("mxbai-rerank-v2", _MXBAI, "1", "0", "", "instruction: {}\n"),
}
#: The record a causal LM of each `model_type` gets when neither its entry nor its files say more.
BY_MODEL_TYPE = {"qwen3": "qwen3-reranker", "gemma": "bge-reranker-v2-gemma", "qwen2": "mxbai-rerank-v2"}


#: Qwen3-VL-Reranker's prompt, as its reference code (the Qwen3-VL-Embedding repository's
#: `Qwen3VLReranker`) builds it: a system message with `QWEN3_VL_SYSTEM`, then one user message of
#: parts "<Instruct>: " + instruction, "<Query>:", the query's, "\n<Document>:", the document's
#: (its image before its text), rendered by the model's chat template with the assistant's turn
#: opened. The model reads no `pieces`: its adapter renders the conversation.
QWEN3_VL_RERANKER = "qwen3-vl-reranker"
QWEN3_VL_SYSTEM = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the "
    'answer can only be "yes" or "no".'
)
QWEN3_VL_INSTRUCTION = "Given a search query, retrieve relevant candidates that answer the query."


def qwen3_vl_prompt(instruction: str | None) -> RerankPrompt:
    """Qwen3-VL-Reranker's tokens and default instruction (the entry's `instruction`, if set)."""
    return RerankPrompt(QWEN3_VL_RERANKER, None, "yes", "no", instruction or QWEN3_VL_INSTRUCTION)


def parse(template: str) -> list[tuple[str, str | None]]:
    """(literal text, field or None) pieces of a template; `ValueError` names what is wrong.

    Only bare {instruction}, {query} and {document} are fields; literal braces are doubled."""
    pieces: list[tuple[str, str | None]] = []
    for text, name, spec, conversion in string.Formatter().parse(template):
        if name is not None and (name not in FIELDS or spec or conversion):
            raise ValueError(
                f"the template has the field {{{name}}}; it takes only {{instruction}}, {{query}} and {{document}} "
                "(write a literal brace as {{ or }})"
            )
        pieces.append((text, name))
    return pieces


def check_template(template: str) -> None:
    """A configured `template`: a record's name, or a template with {query} and {document}."""
    if template in RECORDS:
        return
    named = {name for _, name in parse(template)}
    if not {"query", "document"} <= named:
        raise ValueError(
            "the template must contain {query} and {document} (and may contain {instruction}), "
            f"or name a built-in record: {', '.join(sorted(RECORDS))}"
        )


def chat_template(directory: Path, tokenizer_config: dict[str, Any]) -> str | None:
    """The model's chat template (`chat_template.jinja`, else tokenizer_config.json's), if any."""
    path = directory / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {str(t.get("name")): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def has_pair_roles(template: str | None) -> bool:
    """Whether a chat template names the `query` and `document` roles (a reranker's template; a
    generic chat template passes any role through without naming these)."""
    return template is not None and {m.group(1) for m in _ROLE.finditer(template)} == {"query", "document"}


def resolve(
    directory: Path,
    model_type: str,
    architectures: tuple[str, ...],
    tokenizer_config: dict[str, Any],
    overrides: dict[str, str | None],
) -> RerankPrompt:
    """The prompt of a causal LM served as a reranker; `ModelUnavailable` says what to set."""
    configured = overrides.get("template")
    if configured in RECORDS:
        prompt = RECORDS[configured]
    elif configured is not None:
        prompt = RerankPrompt("configured", (configured,), "yes", "no")
    elif has_pair_roles(chat_template(directory, tokenizer_config)):
        prompt = RerankPrompt(CHAT_TEMPLATE, None, "yes", "no")
    elif model_type in BY_MODEL_TYPE:
        prompt = RECORDS[BY_MODEL_TYPE[model_type]]
    else:
        raise ModelUnavailable(
            f"{directory} holds a causal LM ({', '.join(architectures) or model_type}) with no reranking prompt "
            "known for its layout: set the model's `template` (with {instruction}, {query} and {document}), "
            f"`true_token` and `false_token`, or name a built-in record as `template` ({', '.join(sorted(RECORDS))})"
        )
    if overrides.get("true_token"):
        prompt = replace(prompt, true_token=str(overrides["true_token"]))
    if overrides.get("false_token") is not None:
        prompt = replace(prompt, false_token=overrides["false_token"] or None)
    if overrides.get("instruction") is not None:
        prompt = replace(prompt, instruction=str(overrides["instruction"]))
    return prompt
