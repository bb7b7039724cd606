"""Dense text embedders: a transformer, pooled (mean, CLS, last token, ...), optionally normalised."""

from __future__ import annotations

from model_registry.families.base import Family, Rule
from model_registry.types import Capability, Kind

FAMILY = Family(
    name="dense",
    kind=Kind.DENSE,
    adapter="model_registry.adapters.dense:DenseAdapter",
    capabilities=frozenset({Capability.EMBED_TEXT}),
    summary="sentence-transformers embedders: BERT, XLM-R, MPNet, ModernBERT, Qwen3, Gemma 3, nomic, gte, ...",
    reference="sentence-transformers `SentenceTransformer.encode`",
    default=True,
    engines=("torch", "onnx", "ctranslate2"),
    without_torch="model_registry.adapters.onnx_text:OnnxDense",
    rules=(
        # The kind stage's last rule: a directory no other rule claims is a dense embedder.
        Rule("dense", "kind", lambda f: True, "kind `dense`", order=100, kind=Kind.DENSE),
    ),
)
