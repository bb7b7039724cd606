"""Tokenize and decode with a model's own tokenizer, on the model's prepare threads."""

from __future__ import annotations

from collections.abc import Sequence

from model_registry import validation
from model_registry.runner import Runner
from model_registry.types import Token


async def tokenize(
    registry: Runner,
    model: str,
    texts: Sequence[str],
    *,
    add_special_tokens: bool = True,
    prompt_name: str | None = None,
) -> list[list[Token]]:
    """Each text's tokens as `model` reads them (its prompt first when `prompt_name` is given)."""
    checked = validation.texts(texts, registry.config, "tokenize takes texts", param="inputs")
    adapter = await registry.adapter(model)
    tokenizer = validation.text_tokenizer(adapter, model)
    prompt = validation.prompt_text(adapter, prompt_name, None) if prompt_name else ""
    prompted = [prompt + text for text in checked]
    return await registry.on_model_threads(
        model, lambda: tokenizer.tokens(prompted, add_special_tokens=add_special_tokens)
    )


async def decode(
    registry: Runner, model: str, ids: Sequence[Sequence[int]], *, skip_special_tokens: bool = True
) -> list[str]:
    """Token ids back to text with `model`'s tokenizer; ids outside its vocabulary are `InvalidInput`."""
    validation.contents(ids, registry.config)
    adapter = await registry.adapter(model)
    tokenizer = validation.text_tokenizer(adapter, model)
    return await registry.on_model_threads(
        model, lambda: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    )
