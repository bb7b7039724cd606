"""Sequence classification heads on torch: cross-encoder rerankers and multi-label classifiers.

Both read a `*ForSequenceClassification` directory. A reranker scores (query, document) pairs
with one logit; a classifier gives one logit per label of `id2label` for a text or a pair (an NLI
model's premise and hypothesis). Decoder models (Qwen2, Llama...) are scored on their last real
token found from the attention mask, so neither a missing pad token nor a pad token equal to
end-of-text changes the result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model_registry.adapters.base import LoadOptions
from model_registry.adapters.dense import TextEncoder, as_tensor
from model_registry.adapters.pairs import Encoded, activation_name, encode_pairs, padded, score, uncut_length
from model_registry.backends.base import EncoderBatch, Task
from model_registry.backends.weights import from_pretrained_checked
from model_registry.detection.layout import Layout
from model_registry.errors import InputTooLong, UnsupportedOperation
from model_registry.types import Capability, ClassifyItem, Item, Kind, Labels, PairItem, Prepared, Result


def classifier_head(directory: Path, config: Any, device: str = "cpu") -> Callable[[torch.Tensor], torch.Tensor]:
    """The head of a `*ForSequenceClassification` checkpoint as a function of the last hidden
    state, for engines that return only the encoder's states (CTranslate2), on `device` (where
    the engine leaves those states).

    The checkpoint is read once on CPU and everything but the head is dropped."""
    from transformers import AutoModelForSequenceClassification

    model = from_pretrained_checked(
        AutoModelForSequenceClassification, directory, "sequence-classification", dtype=torch.float32
    ).eval()
    kind = str(getattr(config, "model_type", ""))
    classifier = model.classifier.to(device)
    if kind == "distilbert":
        pre = model.pre_classifier.to(device)
        return lambda states: classifier(torch.relu(pre(states[:, 0])))
    pooler = getattr(getattr(model, model.base_model_prefix, None), "pooler", None)
    if kind == "bert" and pooler is not None:
        pooler = pooler.to(device)
        return lambda states: classifier(pooler(states))
    if kind in ("roberta", "xlm-roberta", "camembert"):
        return lambda states: classifier(states)  # these heads take the CLS state themselves
    raise UnsupportedOperation(f"no classifier head for model type '{kind}' outside the torch engine")


@dataclass(frozen=True)
class SequenceBatch:
    inputs: EncoderBatch


class SequenceClassifier(TextEncoder):
    """Shared by the reranker and the classifier: loading, padding, the forward."""

    task: Task = "sequence-classification"

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        super().__init__(layout, trust_remote_code)
        self.uses_type_ids = False
        self.decoder = False
        self.head: Callable[[torch.Tensor], torch.Tensor] | None = None

    def load(self, options: LoadOptions) -> None:
        self.load_model(options)
        assert self.tokenizer is not None
        assert self.engine is not None
        self.uses_type_ids = "token_type_ids" in self.tokenizer.tokenizer.model_input_names
        self.decoder = bool(getattr(self.engine, "decoder", False))
        if not self.engine.carries_head(self.task):
            self.head = classifier_head(self.layout.transformer_dir, self.config, self.head_device)

    def unload(self) -> None:
        self.head = None
        super().unload()

    def uncut_length(self, text: str, pair: str | None, encoded: Encoded) -> int | None:
        assert self.tokenizer is not None
        return uncut_length(self.tokenizer, text, pair, encoded)

    def collate(self, items: Sequence[Prepared]) -> SequenceBatch:
        assert self.tokenizer is not None, "This is a bug: collate() called before load()"
        return SequenceBatch(padded(self.tokenizer, [p.data for p in items], type_ids=self.uses_type_ids))

    def forward(self, batch: SequenceBatch) -> torch.Tensor:
        output = self.run(batch.inputs)
        with torch.inference_mode():
            if output.logits is not None:
                logits = as_tensor(output.logits)
            else:
                assert self.head is not None, "This is a bug: the engine returned no logits and no head is loaded"
                logits = self.head(self.states(output))
            result: torch.Tensor = logits.float().cpu()
            return result


class RerankerAdapter(SequenceClassifier):
    """One logit per (query, document) pair; `Score.value` has the model's activation applied."""

    kind = Kind.RERANKER
    capabilities = frozenset({Capability.RERANK})

    def load(self, options: LoadOptions) -> None:
        super().load(options)
        assert self.tokenizer is not None
        self.tokenizer.enable_pairs()
        if int(self.config.num_labels) != 1:
            raise UnsupportedOperation(
                f"a reranker needs one output label, this model has {self.config.num_labels}; "
                "serve it with kind: classifier"
            )
        self.activation = activation_name(self.layout.config)

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        pairs = []
        for item in items:
            if not isinstance(item, PairItem):
                raise UnsupportedOperation(
                    f"a reranker scores (query, document) pairs; it cannot take {type(item).__name__}"
                )
            pairs.append(item)
        encoded = self.encode_pairs(pairs)
        return [Prepared(i, len(e.ids), len(e.ids), e) for i, e in enumerate(encoded)]

    def encode_pairs(self, pairs: Sequence[PairItem]) -> list[Encoded]:
        assert self.tokenizer is not None, "This is a bug: prepare() called before load()"
        return encode_pairs(self.tokenizer, pairs)

    def postprocess(self, batch: SequenceBatch, output: torch.Tensor) -> list[Result]:
        return [score(logit, self.activation) for logit in output[:, 0].tolist()]

    def family_facts(self) -> dict[str, Any]:
        return {"activation": self.activation, "decoder": self.decoder}


class ClassifierAdapter(SequenceClassifier):
    """One logit per label; the label names come from the model's `id2label`. An input is a text
    or a pair (an NLI model's premise and hypothesis), tokenized as `tokenizer(text, pair)`."""

    kind = Kind.CLASSIFIER
    capabilities = frozenset({Capability.CLASSIFY})

    def load(self, options: LoadOptions) -> None:
        super().load(options)
        assert self.tokenizer is not None
        self.tokenizer.enable_left_cut()
        mapping = self.config.id2label or {}
        count = int(self.config.num_labels)
        self.labels = tuple(str(mapping.get(i, mapping.get(str(i), f"LABEL_{i}"))) for i in range(count))

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        inputs = []
        for item in items:
            if not isinstance(item, ClassifyItem):
                raise UnsupportedOperation(
                    f"a classifier takes texts or pairs of texts; it cannot take {type(item).__name__}"
                )
            inputs.append(item)
        encoded = self.encode_inputs(inputs)
        return [Prepared(i, len(e.ids), len(e.ids), e) for i, e in enumerate(encoded)]

    def encode_inputs(self, items: Sequence[ClassifyItem]) -> list[Encoded]:
        """Each text, or pair as `tokenizer(text, pair)` encodes it: cut to the model's limit (a
        pair's longer text first) at the end of the texts, or at their start with `truncate_left`;
        with truncation off, an input that was cut is `InputTooLong` naming its index."""
        assert self.tokenizer is not None, "This is a bug: prepare() called before load()"
        groups: dict[tuple[bool, bool], list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault((item.pair is not None, item.truncate_left), []).append(i)
        out: dict[int, Encoded] = {}
        for (paired, left), rows in groups.items():
            seconds = [items[i].pair or "" for i in rows] if paired else None
            encoded = self.tokenizer.run([items[i].text for i in rows], seconds, left=left)
            out.update((row, Encoded(tuple(e.ids), tuple(e.type_ids))) for row, e in zip(rows, encoded, strict=True))
        limit = self.tokenizer.max_length
        for i, item in enumerate(items):
            full = None if item.truncate else self.uncut_length(item.text, item.pair, out[i])
            if full is not None:
                both = "" if item.pair is None else " (its two texts together)"
                raise InputTooLong(
                    f"input {i} has {full} tokens{both}, more than the model's limit of {limit}; "
                    "shorten it or allow truncation",
                    param="input",
                )
        return [out[i] for i in range(len(items))]

    def postprocess(self, batch: SequenceBatch, output: torch.Tensor) -> list[Result]:
        array = np.ascontiguousarray(output.numpy(), dtype=np.float32)
        return [Labels(row, self.labels) for row in array]

    def family_facts(self) -> dict[str, Any]:
        return {"labels": list(self.labels), "decoder": self.decoder}
