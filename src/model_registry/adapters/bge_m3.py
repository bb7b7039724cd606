"""BGE-M3 on torch: dense, sparse and ColBERT outputs from one forward pass of XLM-RoBERTa.

FlagEmbedding's layout: the encoder in the directory root, `colbert_linear.pt` (a state dict of
`Linear(hidden, d)`) and `sparse_linear.pt` (`Linear(hidden, 1)`) beside it. Its formulas:
- dense: the CLS state of the last layer, L2-normalised;
- sparse: `relu(sparse_linear(state))` per token, the max weight per token id, special tokens
  (cls, eos, pad, unk) and zero weights dropped;
- ColBERT: `colbert_linear` on the states after CLS, padding masked out, each vector L2-normalised.
Each item asks for any subset; the heads run once per batch on the shared states.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_registry.adapters import segments
from model_registry.adapters.base import LoadOptions
from model_registry.adapters.dense import TextBatch, TextEncoder
from model_registry.adapters.items import embed_item
from model_registry.adapters.segments import Ragged
from model_registry.detection.layout import Layout
from model_registry.errors import ModelUnavailable
from model_registry.types import Capability, Embedding, Item, Kind, Output, Prepared, Result, SparseVector

_ALL = frozenset(Output)


@dataclass(frozen=True)
class M3Output:
    """The dense vectors (batch, hidden); the sparse weight of each real token and the ColBERT
    vector of each real token after the first, row after row."""

    dense: torch.Tensor
    token_weights: Ragged
    colbert: Ragged


def sparse_from_weights(ids: np.ndarray, weights: np.ndarray, skip: frozenset[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per distinct token id of `ids` its largest weight; skipped ids and zero weights dropped."""
    best: dict[int, float] = {}
    for token, weight in zip(ids.tolist(), weights.tolist(), strict=True):
        if token in skip or weight <= 0:
            continue
        if weight > best.get(token, 0.0):
            best[token] = weight
    indices = np.array(sorted(best), dtype=np.int64)
    return indices, np.array([best[i] for i in indices.tolist()], dtype=np.float32)


class BgeM3Adapter(TextEncoder):
    #: Its heads run over every token (not measured without the pool): it keeps torch's threads.
    small_heads = False
    kind = Kind.MULTI_OUTPUT
    capabilities = frozenset({Capability.EMBED_TEXT, Capability.SPARSE, Capability.MULTIVECTOR})

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        super().__init__(layout, trust_remote_code)
        self.colbert_linear: torch.nn.Linear | None = None
        self.sparse_linear: torch.nn.Linear | None = None
        self.skip: frozenset[int] = frozenset()

    def load(self, options: LoadOptions) -> None:
        self.load_model(options)
        self.colbert_linear = self._head("colbert_linear.pt")
        self.sparse_linear = self._head("sparse_linear.pt")
        self.dimensions = int(self.config.hidden_size)
        hf = self.tokenizer.tokenizer if self.tokenizer else None
        assert hf is not None
        special = (hf.cls_token_id, hf.eos_token_id, hf.pad_token_id, hf.unk_token_id)
        self.skip = frozenset(int(t) for t in special if t is not None)

    def _head(self, name: str) -> torch.nn.Linear:
        path = self.layout.root / name
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            weight = state["weight"]
            linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in state)
            linear.load_state_dict(state)
        except (OSError, KeyError, RuntimeError) as error:
            raise ModelUnavailable(f"cannot read the BGE-M3 head {path}: {error}") from error
        return linear.to(device=self.head_device, dtype=self.head_dtype).eval()

    def unload(self) -> None:
        self.colbert_linear = self.sparse_linear = None
        super().unload()

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        embed_items = [embed_item(item, _ALL, "BGE-M3") for item in items]
        tokens = self.text_tokens(embed_items)
        outputs = [item.outputs for item in embed_items]
        return [Prepared(i, len(t.ids), len(t.ids), (t, outputs[i])) for i, t in enumerate(tokens)]

    def collate(self, items: Sequence[Prepared]) -> tuple[TextBatch, list[frozenset[Output]]]:
        plain = [Prepared(p.index, p.cost, p.tokens, p.data[0], p.group) for p in items]
        return self.text_batch(plain), [p.data[1] for p in items]

    def forward(self, collated: tuple[TextBatch, list[frozenset[Output]]]) -> M3Output:
        assert self.colbert_linear is not None, "This is a bug: forward() called before load()"
        assert self.sparse_linear is not None, "This is a bug: forward() called before load()"
        batch = collated[0]
        output = self.run(batch.inputs)
        real = batch.attention_mask.bool()
        first = torch.zeros_like(real)
        first[:, 0] = True  # XLM-RoBERTa pads on the right: a row's first position is its CLS
        with torch.inference_mode():
            states = self.states(output)
            dense = torch.nn.functional.normalize(segments.select(states, first, output.packed).float(), dim=-1)
            weights = torch.relu(self.sparse_linear(segments.select(states, real, output.packed))).squeeze(-1)
            later = real & ~first
            colbert = self.colbert_linear(segments.select(states, later, output.packed)).float()
            colbert = torch.nn.functional.normalize(colbert, dim=-1)
            return M3Output(
                dense.cpu(),
                Ragged(weights.float().cpu(), tuple(real.sum(dim=1).tolist())),
                Ragged(colbert.cpu(), tuple(later.sum(dim=1).tolist())),
            )

    def postprocess(self, collated: tuple[TextBatch, list[frozenset[Output]]], output: M3Output) -> list[Result]:
        batch, wanted = collated
        ids, mask = batch.inputs.input_ids, batch.inputs.attention_mask.astype(bool)
        dense, weights, colbert = output.dense.numpy(), output.token_weights.rows(), output.colbert.rows()
        results: list[Result] = []
        for row, outputs in enumerate(wanted):
            sparse = None
            if Output.SPARSE in outputs:
                indices, values = sparse_from_weights(ids[row][mask[row]], weights[row], self.skip)
                assert self.tokenizer is not None
                tokens = tuple(self.tokenizer.tokenizer.convert_ids_to_tokens(indices.tolist()))
                sparse = SparseVector(indices, values, tokens)
            results.append(
                Embedding(
                    dense=np.ascontiguousarray(dense[row]) if Output.DENSE in outputs else None,
                    sparse=sparse,
                    multivector=colbert[row] if Output.MULTIVECTOR in outputs else None,
                )
            )
        return results

    def family_facts(self) -> dict[str, Any]:
        return {"outputs": sorted(o.value for o in _ALL), "colbert_dim": self.dimensions}
