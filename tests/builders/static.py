"""Tiny static embedding models, saved by their own libraries: model2vec's `StaticModel.save_pretrained`
(its config.json, `embeddings`, optional `weights` and `mapping`, and the modules.json it writes for
sentence-transformers) and sentence-transformers' `StaticEmbedding` in a saved `SentenceTransformer`.

The tokenizer is the tests' WordPiece one (a few hundred tokens, `[UNK]` among them); the vectors
are random, 16 wide.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from tests.builders.text import wordpiece_tokenizer

WIDTH = 16
#: The modules.json types sentence-transformers 3.x wrote, as the published StaticEmbedding models have them.
_PUBLISHED_TYPES = {
    "StaticEmbedding": "sentence_transformers.models.StaticEmbedding",
    "Normalize": "sentence_transformers.models.Normalize",
}


def tiny_model2vec(
    root: Path,
    *,
    normalize: bool = True,
    modules: bool = True,
    quantized: bool = False,
    max_length: int | None = 512,
    dtype: str = "float32",
    seed: int = 0,
) -> Path:
    """A model2vec model as `StaticModel.save_pretrained` writes it: config.json (`model_type:
    model2vec`, `normalize`, `max_length`), model.safetensors and tokenizer.json, with the
    modules.json it writes for sentence-transformers unless `modules` is false (as releases before
    it wrote them). `quantized`: a vocabulary-quantized model, a few shared vectors picked by
    `mapping` and scaled by per-token `weights`."""
    from model2vec import StaticModel

    tokenizer = wordpiece_tokenizer().backend_tokenizer
    rng = np.random.default_rng(seed)
    vocabulary = tokenizer.get_vocab_size()
    weights = mapping = None
    if quantized:
        vectors = rng.standard_normal((24, WIDTH))
        mapping = rng.integers(0, 24, vocabulary)
        weights = rng.uniform(0.2, 2.0, vocabulary).astype(np.float32)
    else:
        vectors = rng.standard_normal((vocabulary, WIDTH))
    config = {"model_type": "model2vec", "architectures": ["StaticModel"], "hidden_dim": WIDTH, "apply_zipf": True}
    model = StaticModel(
        vectors.astype(dtype),
        tokenizer,
        config=config,
        normalize=normalize,
        weights=weights,
        token_mapping=mapping,
        max_length=max_length,
    )
    model.save_pretrained(root)
    if not modules:
        (root / "modules.json").unlink()
    return root


def tiny_potion(root: Path) -> Path:
    """potion-base-8M's and potion-retrieval-32M's layout: model2vec's, normalised, with its modules.json."""
    return tiny_model2vec(root)


def tiny_static_embedding(
    root: Path, *, normalize: bool = False, published: bool = True, truncation: int | None = None, seed: int = 0
) -> Path:
    """sentence-transformers' StaticEmbedding (then Normalize), saved by a `SentenceTransformer`.

    `published`: laid out as the hub's static-retrieval-mrl and static-similarity-mrl models are
    (sentence-transformers 3.x: the module in `0_StaticEmbedding/`, types under
    `sentence_transformers.models`); else as the installed release saves it (the module at the
    root). `truncation`: the tokenizer cuts texts at this many tokens, as its tokenizer.json says."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, StaticEmbedding

    tokenizer = wordpiece_tokenizer().backend_tokenizer
    if truncation is not None:
        tokenizer.enable_truncation(truncation)
    vectors = np.random.default_rng(seed).standard_normal((tokenizer.get_vocab_size(), WIDTH)).astype(np.float32)
    modules: list[Any] = [StaticEmbedding(tokenizer, embedding_weights=vectors), *([Normalize()] if normalize else [])]
    SentenceTransformer(modules=modules, device="cpu").save(str(root))
    if published:
        _as_published(root)
    return root


def _as_published(root: Path) -> None:
    """Move the StaticEmbedding module into `0_StaticEmbedding/` and name the modules as 3.x did."""
    listed = json.loads((root / "modules.json").read_text())
    (root / "0_StaticEmbedding").mkdir()
    for name in ("model.safetensors", "tokenizer.json"):
        shutil.move(root / name, root / "0_StaticEmbedding" / name)
    for module in listed:
        name = module["type"].rsplit(".", 1)[-1]
        module["type"] = _PUBLISHED_TYPES[name]
        if name == "StaticEmbedding":
            module["path"] = "0_StaticEmbedding"
    (root / "modules.json").write_text(json.dumps(listed, indent=2))
