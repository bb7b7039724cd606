"""Tiny sentence-transformers Router models, built and saved by the library itself.

- Inference-free sparse (opensearch-neural-sparse-encoding-doc-v3-distill and -gte): a Router
  whose query route is a SparseStaticEmbedding (an IDF table) and whose document route is a
  masked LM with SpladePooling (log1p_relu, max), saved by a `SparseEncoder`. `published` lays it
  out as the hub's models are (sentence-transformers 5: `document_0_MLMTransformer/`, types under
  `sentence_transformers.sparse_encoder.models` and `sentence_transformers.models.Router`).
- A dense Router: a StaticEmbedding query route and a BERT + mean Pooling document route, 32
  wide both, followed by Normalize, saved by a `SentenceTransformer`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from tests.builders.held_out import distilbert_tokenizer
from tests.builders.text import wordpiece_tokenizer, write_json
from tests.builders.zoo import SMALL

#: sentence-transformers 5's names of the modules, as the published models' files give them.
_PUBLISHED = {
    "Router": "sentence_transformers.models.Router",
    "SparseStaticEmbedding": "sentence_transformers.sparse_encoder.models.SparseStaticEmbedding",
    "Transformer": "sentence_transformers.sparse_encoder.models.MLMTransformer",
    "SpladePooling": "sentence_transformers.sparse_encoder.models.SpladePooling",
}


def _distilbert_mlm(root: Path, seed: int) -> Path:
    from transformers import DistilBertConfig, DistilBertForMaskedLM

    torch.manual_seed(seed)
    tokenizer = distilbert_tokenizer()
    config = DistilBertConfig(
        vocab_size=len(tokenizer), dim=32, hidden_dim=64, n_layers=2, n_heads=2, max_position_embeddings=128
    )
    model = DistilBertForMaskedLM(config).eval()
    with torch.no_grad():  # logits spread enough that many tokens pass the ReLU
        model.vocab_projector.bias.normal_(0.0, 2.0)
    model.save_pretrained(root)
    tokenizer.save_pretrained(root)
    return root


def tiny_inference_free_sparse(
    root: Path, *, published: bool = True, activation: Literal["relu", "log1p_relu"] = "log1p_relu", seed: int = 0
) -> Path:
    """opensearch-neural-sparse-encoding-doc-v3-distill's layout: IDF queries, SPLADE documents."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Router, Transformer
    from sentence_transformers.sparse_encoder.modules import SparseStaticEmbedding, SpladePooling

    mlm = _distilbert_mlm(root.parent / f"{root.name}-mlm", seed)
    document = Transformer(str(mlm), transformer_task="fill-mask")
    vocabulary = len(document.tokenizer.get_vocab())
    rng = np.random.default_rng(seed)
    # an IDF table: most tokens weighted, some never seen in the corpus (0), as from_json leaves them
    idf = rng.uniform(0.1, 6.0, vocabulary) * (rng.random(vocabulary) > 0.2)
    query = SparseStaticEmbedding(tokenizer=document.tokenizer, weight=torch.tensor(idf, dtype=torch.float32))
    router = Router.for_query_document(
        query_modules=[query], document_modules=[document, SpladePooling("max", activation_function=activation)]
    )
    SparseEncoder(modules=[router], similarity_fn_name="dot", device="cpu").save(str(root))
    shutil.rmtree(mlm)
    if published:
        _as_published(root)
    return root


def _as_published(root: Path) -> None:
    """sentence-transformers 5's layout of the same model: MLMTransformer, its directory and names."""
    config = json.loads((root / "router_config.json").read_text())
    renamed = {name: name.replace("_Transformer", "_MLMTransformer") for name in config["types"]}
    for old, new in renamed.items():
        if old != new:
            (root / old).rename(root / new)
            write_json(root / new / "sentence_bert_config.json", {"max_seq_length": 128, "do_lower_case": False})
    config["types"] = {renamed[k]: _PUBLISHED[v.rsplit(".", 1)[-1]] for k, v in config["types"].items()}
    config["structure"] = {route: [renamed[m] for m in ids] for route, ids in config["structure"].items()}
    config["parameters"] = {"default_route": "document", "allow_empty_key": True}
    write_json(root / "router_config.json", config)
    listed = json.loads((root / "modules.json").read_text())
    listed[0]["type"] = _PUBLISHED["Router"]
    write_json(root / "modules.json", listed)


def tiny_dense_router(root: Path, *, seed: int = 0) -> Path:
    """A dense asymmetric model: StaticEmbedding queries, BERT + mean pooling documents, then Normalize."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Router, Transformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, StaticEmbedding
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    tokenizer = wordpiece_tokenizer()
    bert = root.parent / f"{root.name}-bert"
    BertModel(BertConfig(vocab_size=len(tokenizer), max_position_embeddings=128, **SMALL)).eval().save_pretrained(bert)
    tokenizer.save_pretrained(bert)
    document = Transformer(str(bert))
    width = int(SMALL["hidden_size"])
    vectors = np.random.default_rng(seed).standard_normal((len(tokenizer), width)).astype(np.float32)
    query: list[Any] = [StaticEmbedding(tokenizer.backend_tokenizer, embedding_weights=vectors)]
    router = Router.for_query_document(query_modules=query, document_modules=[document, Pooling(width, "mean")])
    SentenceTransformer(modules=[router, Normalize()], device="cpu").save(str(root))
    shutil.rmtree(bert)
    return root


def tiny_inference_free_gte(root: Path, *, seed: int = 0) -> Path:
    """opensearch-neural-sparse-encoding-doc-v3-gte's layout: the document route's masked LM in
    Alibaba-NLP/new-impl's layout (model_type `new`, `NewForMaskedLM`, its weight names, its
    `auto_map`), as gte-base-en-v1.5 publishes it (RoPE base 500,000, no scaling).

    The same model with the document route in transformers' own gte layout is kept beside it, as
    `<root>-reference`: sentence-transformers loads that one without the hub code."""
    from safetensors.torch import save_file
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Router, Transformer
    from sentence_transformers.sparse_encoder.modules import SparseStaticEmbedding, SpladePooling
    from transformers import GteConfig, GteForMaskedLM

    from tests.builders.gte import HEADS, HIDDEN, NEW_IMPL, published_config, published_weights

    torch.manual_seed(seed)
    tokenizer = distilbert_tokenizer()
    pad = int(tokenizer.pad_token_id)
    config = GteConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        intermediate_size=64,
        max_position_embeddings=128,
        type_vocab_size=1,
        pad_token_id=pad,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    )
    model = GteForMaskedLM(config).eval()
    with torch.no_grad():
        model.lm_head.decoder.bias.normal_(0.0, 2.0)
        for name, weight in model.named_parameters():  # layer norms away from the identity, so they count
            if "norm" in name.lower() and name.endswith("weight"):
                weight.add_(torch.randn_like(weight) * 0.2)
    native = root.parent / f"{root.name}-native-mlm"
    model.save_pretrained(native)
    tokenizer.save_pretrained(native)
    document = Transformer(str(native), transformer_task="fill-mask")
    rng = np.random.default_rng(seed)
    vocabulary = len(document.tokenizer.get_vocab())
    idf = rng.uniform(0.1, 6.0, vocabulary) * (rng.random(vocabulary) > 0.2)
    query = SparseStaticEmbedding(tokenizer=document.tokenizer, weight=torch.tensor(idf, dtype=torch.float32))
    router = Router.for_query_document(
        query_modules=[query], document_modules=[document, SpladePooling("max", activation_function="log1p_relu")]
    )
    reference = root.parent / f"{root.name}-reference"
    SparseEncoder(modules=[router], similarity_fn_name="dot", device="cpu").save(str(reference))
    shutil.rmtree(native)
    shutil.copytree(reference, root, dirs_exist_ok=True)
    _as_published(root)
    mlm = root / "document_0_MLMTransformer"
    state = model.state_dict()
    weights = {f"new.{k}": v for k, v in published_weights(model.gte).items()}
    for part in ("dense.weight", "dense.bias", "decoder.weight", "decoder.bias"):
        weights[f"lm_head.{part}"] = state[f"lm_head.{part}"].detach().clone()
    for part in ("weight", "bias"):
        weights[f"lm_head.norm.{part}"] = state[f"lm_head.layer_norm.{part}"].detach().clone()
    (mlm / "model.safetensors").unlink()
    save_file({k: v.contiguous() for k, v in weights.items()}, mlm / "model.safetensors", metadata={"format": "pt"})
    published = published_config(len(tokenizer), pad)
    published.update(
        architectures=["NewForMaskedLM"],
        auto_map={
            "AutoConfig": f"{NEW_IMPL}--configuration.NewConfig",
            "AutoModel": f"{NEW_IMPL}--modeling.NewModel",
            "AutoModelForMaskedLM": f"{NEW_IMPL}--modeling.NewForMaskedLM",
        },
        rope_scaling=None,
        rope_theta=500000.0,
    )
    write_json(mlm / "config.json", published)
    return root
