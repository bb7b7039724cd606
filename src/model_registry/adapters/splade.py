"""SPLADE sparse embeddings on torch: MaskedLM logits -> log(1 + relu) -> max over real tokens.

Reads a plain `*ForMaskedLM` directory (served with `kind: sparse`) or sentence-transformers'
SparseEncoder layout (MLMTransformer + SpladePooling, whose `pooling_strategy` may be max or sum,
and whose `activation_function` log1p_relu, of the opensearch models, takes log1p once more).
Options (the model entry's `options`): `top_k` keeps the k largest weights, `threshold` drops
weights below it; both apply after pooling, so the kept weights are exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from model_registry.adapters import segments
from model_registry.adapters.base import LoadOptions
from model_registry.adapters.dense import TextBatch, TextEncoder, as_tensor
from model_registry.adapters.items import embed_item
from model_registry.backends.base import Packed, Task
from model_registry.detection.layout import Layout, read_json
from model_registry.errors import ConfigError
from model_registry.types import Capability, Embedding, Item, Kind, Output, Prepared, Result, SparseVector

_SPARSE = frozenset({Output.SPARSE})


#: SpladePooling's activation functions (before its log1p): relu, or log1p(relu), of the opensearch models.
_ACTIVATIONS = ("relu", "log1p_relu")
#: At most this many logits are widened to float32 at once (64 MiB).
_WIDENED = 1 << 24


def splade_pool(logits: torch.Tensor, mask: torch.Tensor, strategy: str = "max", twice: bool = False) -> torch.Tensor:
    """(batch, tokens, vocab) logits -> (batch, vocab) weights, padding excluded, in float32;
    `twice`: log1p applied twice (SpladePooling's log1p_relu)."""
    if logits.dtype != torch.float32:
        # Half-precision logits (on CUDA) are widened a few rows at a time, never the whole batch:
        # the (batch, tokens, vocab) tensor is the largest thing a SPLADE batch holds.
        rows = max(1, _WIDENED // max(1, logits.shape[1] * logits.shape[2]))
        parts = zip(torch.split(logits, rows), torch.split(mask, rows), strict=True)
        return torch.cat([splade_pool(part.float(), part_mask, strategy, twice) for part, part_mask in parts])
    # In place, for the same reason.
    weights = logits
    torch.relu_(weights)
    torch.log1p_(weights)
    if twice:
        torch.log1p_(weights)
    weights.mul_(mask.unsqueeze(-1).to(torch.float32))
    return weights.sum(dim=1) if strategy == "sum" else weights.max(dim=1).values


def splade_pool_packed(
    logits: torch.Tensor, mask: torch.Tensor, packed: Packed, strategy: str = "max", twice: bool = False
) -> torch.Tensor:
    """`splade_pool` on a padding-free batch: (tokens, vocab) logits of the packed tokens, `mask`
    (tokens,) -> (batch, vocab), each sequence's segment reduced, a few tokens widened at a time."""
    step = logits.shape[0] if logits.dtype == torch.float32 else max(1, _WIDENED // max(1, logits.shape[1]))
    pooled = torch.zeros((packed.cu_seqlens.shape[0] - 1, logits.shape[1]), dtype=torch.float32, device=logits.device)
    for start in range(0, logits.shape[0], step):
        weights = logits[start : start + step].float()
        torch.relu_(weights)
        torch.log1p_(weights)
        if twice:
            torch.log1p_(weights)
        weights.mul_(mask[start : start + step].unsqueeze(-1).to(torch.float32))
        rows = packed.segments[start : start + step]
        if strategy == "sum":
            pooled.index_add_(0, rows, weights)
        else:  # the weights are >= 0, so the zeros it starts from change no maximum
            pooled.scatter_reduce_(0, rows.unsqueeze(1).expand_as(weights), weights, "amax")
    return pooled


def prune(row: np.ndarray, top_k: int | None, threshold: float) -> np.ndarray:
    """Indices of the kept non-zero weights of `row`, in increasing index order."""
    kept = np.flatnonzero(row > threshold)
    if top_k is not None and kept.size > top_k:
        kept = np.sort(kept[np.argsort(-row[kept], kind="stable")[:top_k]])
    return kept


class SpladeAdapter(TextEncoder):
    #: Its head works over the whole vocabulary for every token: it keeps torch's threads.
    small_heads = False
    kind = Kind.SPARSE
    capabilities = frozenset({Capability.SPARSE})

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        super().__init__(layout, trust_remote_code)
        options = layout.options
        self.top_k = int(options["top_k"]) if options.get("top_k") is not None else None
        self.threshold = float(options.get("threshold", 0.0))
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"options.top_k must be at least 1, got {self.top_k}")
        where = layout.module_dirs.get("SpladePooling")
        pooling = read_json(where / "config.json") if where is not None else {}
        self.strategy = str(pooling.get("pooling_strategy", "max"))
        self.activation = str(pooling.get("activation_function", "relu"))
        if self.strategy not in ("max", "sum"):
            raise ConfigError(f"SpladePooling pooling_strategy '{self.strategy}' is not supported; use max or sum")
        if self.activation not in _ACTIVATIONS:
            raise ConfigError(
                f"SpladePooling activation_function '{self.activation}' is not supported; use relu or log1p_relu"
            )

    task: Task = "masked-lm"

    def load(self, options: LoadOptions) -> None:
        self.load_model(options)
        assert self.tokenizer is not None
        self.dimensions = self.tokenizer.vocab_size
        self._footprint += options.max_batch_tokens * self.dimensions * 4  # the float32 vocabulary logits

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        embed_items = [embed_item(item, _SPARSE, "a SPLADE model") for item in items]
        tokens = self.text_tokens(embed_items)
        return [Prepared(i, len(t.ids), len(t.ids), t) for i, t in enumerate(tokens)]

    def collate(self, items: Sequence[Prepared]) -> TextBatch:
        return self.text_batch(items)

    def forward(self, batch: TextBatch) -> torch.Tensor:
        output = self.run(batch.inputs)
        with torch.inference_mode():
            logits = as_tensor(output.logits)
            if output.packed is not None:
                mask = segments.tokens(batch.attention_mask, output.packed)
                return splade_pool_packed(logits, mask, output.packed, self.strategy, self._twice).cpu()
            mask = batch.attention_mask.to(logits.device)
            pooled: torch.Tensor = splade_pool(logits, mask, self.strategy, self._twice).cpu()
            return pooled

    @property
    def _twice(self) -> bool:
        return self.activation == "log1p_relu"

    def postprocess(self, batch: TextBatch, output: torch.Tensor) -> list[Result]:
        assert self.tokenizer is not None
        array = output.numpy()
        results: list[Result] = []
        for row in array:
            kept = prune(row, self.top_k, self.threshold)
            tokens = tuple(self.tokenizer.tokenizer.convert_ids_to_tokens(kept.tolist()))
            vector = SparseVector(kept.astype(np.int64), row[kept].astype(np.float32), tokens)
            results.append(Embedding(sparse=vector))
        return results

    def family_facts(self) -> dict[str, Any]:
        return {
            "pooling": self.strategy,
            "activation": self.activation,
            "top_k": self.top_k,
            "threshold": self.threshold,
        }
