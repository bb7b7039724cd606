"""Checks shared by the embedding adapters of the text zoo."""

from __future__ import annotations

from model_registry.errors import UnsupportedOperation
from model_registry.types import EmbedItem, Item, Output


def embed_item(item: Item, allowed: frozenset[Output], what: str) -> EmbedItem:
    """`item` as an `EmbedItem` asking only for outputs in `allowed`, else `UnsupportedOperation`."""
    if not isinstance(item, EmbedItem):
        raise UnsupportedOperation(f"{what} embeds texts; it cannot take {type(item).__name__}")
    extra = item.outputs - allowed
    if extra:
        asked = ", ".join(sorted(o.value for o in extra))
        have = ", ".join(sorted(o.value for o in allowed))
        raise UnsupportedOperation(f"{what} cannot produce {asked} output; it produces {have}", param="outputs")
    return item
