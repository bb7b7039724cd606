"""Tokenize and decode with a model's own tokenizer, on the model's prepare threads."""

from __future__ import annotations

from collections.abc import Sequence

from model_registry.errors import InvalidInput
from model_registry.runtime.runner import Runner
from model_registry.tasks import validation
from model_registry.types import Token

#: The most token ids one row of `decode` may hold. One Rust decode call holds the interpreter
#: throughout (about 25 ms for 16,384 ids of MiniLM's vocabulary on one core, 0.14 s for 100,000),
#: and the event loop waits for it. 32,768 hold the tokens of a 100,000-character English text
#: (max_input_chars' default; 20,000 to 25,000 tokens for MiniLM).
MAX_DECODE_IDS = 32_768


async def tokenize(
    registry: Runner,
    model: str,
    texts: Sequence[str],
    *,
    add_special_tokens: bool = True,
    prompt_name: str | None = None,
    byte_offsets: bool = False,
    max_tokens: int | None = None,
) -> list[list[Token]]:
    """Each whole text's tokens as `model` reads them (its prompt first when `prompt_name` is
    given), never truncated; spans in characters, or in UTF-8 bytes with `byte_offsets`. More than
    `max_tokens` tokens in all is `InvalidInput`, found before the rest are tokenized."""
    checked = validation.texts(texts, registry.config, "tokenize takes texts", param="inputs")
    adapter = await registry.adapter(model)
    tokenizer = validation.text_tokenizer(adapter, model)
    prompt = validation.prompt_text(adapter, prompt_name, None) if prompt_name else ""
    prompted = [prompt + text for text in checked]
    return await registry.on_model_threads(
        model,
        # Never cut: who counts tokens before chunking a text needs every one (TEI cuts none either).
        lambda: tokenizer.tokens(
            prompted, add_special_tokens=add_special_tokens, cut=None, byte_offsets=byte_offsets, max_tokens=max_tokens
        ),
    )


async def decode(
    registry: Runner, model: str, ids: Sequence[Sequence[int]], *, skip_special_tokens: bool = True
) -> list[str]:
    """Token ids back to text with `model`'s tokenizer; ids outside its vocabulary, or a row of more
    than `MAX_DECODE_IDS`, are `InvalidInput`."""
    long_row = next(((i, len(row)) for i, row in enumerate(ids) if len(row) > MAX_DECODE_IDS), None)
    if long_row is not None:
        index, count = long_row
        raise InvalidInput(
            f"ids row {index} has {count:,} token ids; at most {MAX_DECODE_IDS:,} are decoded per row: "
            "split it into several rows (a batch of lists) and join their texts",
            param="ids",
        )
    validation.contents(ids, registry.config)
    adapter = await registry.adapter(model)
    tokenizer = validation.text_tokenizer(adapter, model)
    return await registry.on_model_threads(
        model, lambda: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    )
