"""Exporting a transformers model to ONNX with torch's dynamo exporter, then optimizing and
quantizing the graph with onnxruntime's own tools.

optimum's exporter is not used: optimum-onnx requires transformers < 4.58. `torch.onnx.export(...,
dynamo=True)` exports BERT-family encoders, ModernBERT, nomic_bert, and the Qwen3 and Gemma 3
decoders with torch 2.14 and transformers 5 (last hidden state within 2.5e-5 of eager torch on
MiniLM, within 2e-6 on tiny random models of the others).
"""

from __future__ import annotations

import inspect
import logging
import time
from pathlib import Path
from typing import Any

import torch

from model_registry.backends.base import TASK_INPUT, Task
from model_registry.backends.torch import lora
from model_registry.backends.weights import from_pretrained_checked

log = logging.getLogger(__name__)

_AUTO = {
    "feature-extraction": "AutoModel",
    "sequence-classification": "AutoModelForSequenceClassification",
    "masked-lm": "AutoModelForMaskedLM",
}
#: Graph output name per task; the engine reads outputs by these names.
#: The attention the export runs models with sliding windows on (see `_register_attention`).
_ATTENTION = "sdpa_no_key_zero"
OUTPUT = {"feature-extraction": "last_hidden_state", "sequence-classification": "logits", "masked-lm": "logits"}


class _Forward(torch.nn.Module):
    """The model with positional inputs and one named output, as the exporter wants it; with
    `adapters`, the task adapter the `task_id` input selects (`lora.for_export`)."""

    def __init__(self, model: Any, task: Task, type_ids: bool, adapters: lora.Selection | None = None) -> None:
        super().__init__()
        self.model, self.task, self.type_ids, self.adapters = model, task, type_ids, adapters

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        task_id: torch.Tensor | None = None,
    ) -> torch.Tensor:
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        if self.adapters is not None:
            self.adapters.task = task_id
        output = self.model(input_ids=input_ids, attention_mask=attention_mask, **extra)
        result: torch.Tensor = output[0] if self.task == "feature-extraction" else output.logits
        return result


def _register_attention() -> str:
    """transformers' SDPA attention, with torch's answer for a query that may attend to no key.

    A padded position outside every real token's sliding window (ModernBERT's, Gemma 3's) has no
    key left. torch's SDPA gives it a zero output; the exporter's lowering of SDPA, the mean of
    all values. ColBERT's query expansion reads those positions' vectors, so the graph zeroes
    them as torch does."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def attention(module: Any, query: Any, key: Any, value: Any, mask: Any, **kwargs: Any) -> tuple[Any, Any]:
        output, weights = sdpa_attention_forward(module, query, key, value, mask, **kwargs)
        if mask is not None and mask.dtype == torch.bool:  # (batch, heads or 1, queries, keys)
            output = output * mask.any(dim=-1).transpose(1, 2).unsqueeze(-1).to(output.dtype)
        return output, weights

    AttentionInterface.register(_ATTENTION, attention)
    AttentionMaskInterface.register(_ATTENTION, sdpa_mask)
    return _ATTENTION


def export(directory: Path, task: Task, target: Path, *, trust_remote_code: bool = False) -> list[str]:
    """Write `target` (model.onnx) for `task`; returns the graph's input names. A directory with
    task adapters (`lora.for_export`) gives a graph that also takes `TASK_INPUT`."""
    import transformers

    started = time.monotonic()
    log.info("exporting %s to ONNX for %s (once; later loads read the cache)", directory, task)
    model = from_pretrained_checked(
        getattr(transformers, _AUTO[task]), directory, task, dtype=torch.float32, trust_remote_code=trust_remote_code
    )
    model = model.eval()
    if "sliding_attention" in (getattr(model.config, "layer_types", None) or ()):
        model.set_attn_implementation(_register_attention())
    # The signature, not the code object: transformers wraps `forward`, whose own variables then
    # lack the argument, and a pair's segment ids would be left out of the graph.
    type_ids = (
        "token_type_ids" in inspect.signature(model.forward).parameters
        and getattr(model.config, "type_vocab_size", 0) > 1
    )
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if type_ids else [])
    sample = tuple(torch.ones((2, 8), dtype=torch.long) for _ in names)  # one tensor each: not aliased
    batch, tokens = torch.export.Dim("batch"), torch.export.Dim("tokens")
    shapes: dict[str, Any] = {name: {0: batch, 1: tokens} for name in names}
    adapters = lora.for_export(model, directory)
    named = {}
    if adapters is not None:
        named[TASK_INPUT] = torch.tensor(0)
        shapes[TASK_INPUT] = None
    with torch.inference_mode(False), torch.no_grad():
        program = torch.onnx.export(
            _Forward(model, task, type_ids, adapters),
            sample,
            kwargs=named,
            dynamo=True,
            input_names=names + list(named),
            output_names=[OUTPUT[task]],
            dynamic_shapes=shapes,
            optimize=True,
            verbose=False,
        )
    assert program is not None, "This is a bug: the dynamo exporter returned no program"
    program.save(str(target), external_data=False)
    log.info("exported %s in %.1f s", target, time.monotonic() - started)
    return names + list(named)
