"""The torch engine: transformers' models as published, every kind and architecture (their own code
included), padding-free batches (`packed`), CUDA graphs for small batches (`graphs`), fp8 weights
(`fp8`) and jina's LoRA task adapters (`lora`). The engine itself is `engine.TorchEngine`."""

from __future__ import annotations

from model_registry.backends.base import EngineFacts

ENGINE = EngineFacts(
    name="torch",
    title="torch",
    implementation="model_registry.backends.torch.engine:TorchEngine",
    extra="torch",
    probe="torch",
    dtypes=frozenset({"auto", "float32", "float16", "bfloat16"}),
    quantize=frozenset({"none", "fp8"}),
)
