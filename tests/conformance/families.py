"""The conformance matrix's list: every family the server detects or the catalogue lists, as a tiny
random model in its published layout, with the reference implementation its answers must equal.

Each family says what it is (kind, architecture), which catalogue records and detection rules it
stands for, how it is asked (`probe`) and how its reference answers the same questions. The
engines it runs on are not listed here: they are read from the engine tables
(`backends.choice`), so that a family an engine claims is a family the matrix runs on it.
`table()` renders the list as the table in docs/text-zoo.md.
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from model_registry import backends
from model_registry.backends import choice
from model_registry.zoo.files import is_causal_lm
from tests.builders.catalogue import (
    NOMIC_PROMPTS,
    tiny_embeddinggemma,
    tiny_gte_modernbert,
    tiny_modernbert_embedder,
    tiny_nomic,
)
from tests.builders.embedders import tiny_xlmr
from tests.builders.gme import tiny_gme
from tests.builders.gte import tiny_gte_multilingual
from tests.builders.jina import tiny_jina_v3
from tests.builders.jina_v4 import tiny_jina_v4
from tests.builders.llm_rerankers import (
    tiny_gemma_reranker,
    tiny_mxbai_reranker,
    tiny_qwen3_embedding,
    tiny_qwen3_reranker,
    with_chat_template,
)
from tests.builders.media import image_bytes, tiny_clip, tiny_open_clip, tiny_siglip2, tiny_siglip2_naflex
from tests.builders.nomic_multimodal import tiny_nomic_multimodal
from tests.builders.peft import tiny_bert_with_adapter
from tests.builders.qwen3_vl import tiny_qwen3_vl_embedding, tiny_qwen3_vl_reranker
from tests.builders.routers import tiny_dense_router, tiny_inference_free_gte, tiny_inference_free_sparse
from tests.builders.static import tiny_potion, tiny_static_embedding
from tests.builders.text import tiny_bert
from tests.builders.zoo import (
    tiny_bge_m3,
    tiny_colbert,
    tiny_cross_encoder,
    tiny_masked_lm,
    tiny_modern_colbert,
    tiny_modernbert_cross_encoder,
    tiny_pylate,
    tiny_xlmr_cross_encoder,
)
from tests.conformance import references as ref
from tests.integration.zoo.test_remote_code import tiny_remote_code_model

Probe = Literal["dense", "rerank", "classify", "sparse", "multivector", "multi_output", "image_text"]

ENGINES = backends.names()
ENGINE_NAMES = {**{e.name: e.title for e in backends.declared()}, "numpy": "numpy"}
#: The device classes `auto` tells apart, each with the precision it runs a model in by default.
HOSTS = {"cpu/avx2": "fp32", "cpu/avx512_vnni": "fp32", "cpu/amx": "fp32", "cpu/other": "fp32", "cuda": "float16"}
HOST_NAMES = {"cpu/avx2": "AVX2", "cpu/avx512_vnni": "AVX-512 VNNI", "cpu/amx": "AMX", "cpu/other": "other CPU"}

TEXTS = [
    "The cat sleeps on the warm windowsill.",
    "Two dogs are running through the snow, barking at every passing car!",
    "What is the capital of France? Paris, of course.",
    "hello",
]
QUERY = "Which animal sleeps on the windowsill?"
PICTURES = [image_bytes(40, 28, seed=1), image_bytes(24, 36, seed=2)]


@dataclass(frozen=True)
class Family:
    """One row of the matrix."""

    name: str
    #: The published checkpoints it stands for; catalogue ids among them are the records it covers.
    examples: tuple[str, ...]
    build: Callable[[Path], Path]
    kind: str
    architecture: str
    probe: Probe
    reference: ref.Reference
    #: The detection rules that decide what its directory is (`detection.rules`).
    rules: tuple[str, ...]
    #: Keys of its configuration entry beyond name and source (no `backend`: the matrix adds it).
    entry: dict[str, Any] = field(default_factory=dict)
    #: Whether its queries are asked apart (`prompt_name: query`): models with a query prompt or form.
    queries: bool = False
    texts: tuple[str, ...] = tuple(TEXTS)

    #: config.json's `architectures`, where the engine tables read it (a causal LM's head).
    architectures: tuple[str, ...] = ()
    #: Whether its own code runs it (config.json's `auto_map`, `trust_remote_code: true`).
    own_code: bool = False
    #: Whether it runs on no engine (a static model: numpy in its adapter): served with no backend
    #: key alone, each engine named in its entry a start-up error.
    engineless: bool = False
    #: Why it runs on torch alone, where its configuration keeps it there (LoRA adapters per request).
    torch_only: str | None = None

    @property
    def llm_reranker(self) -> bool:
        return self.kind == "reranker" and is_causal_lm(self.architectures)

    @property
    def config(self) -> dict[str, Any]:
        """What the engine tables read of its config.json."""
        config: dict[str, Any] = {"model_type": self.architecture, "architectures": list(self.architectures)}
        return {**config, "auto_map": {"AutoModel": "modeling.Model"}} if self.own_code else config


def _pair_template_reranker(root: Path) -> Path:
    return with_chat_template(tiny_qwen3_reranker(root))


def _answerai(root: Path) -> Path:
    return tiny_pylate(root, prefixes=("[unused0]", "[unused1]"))


def _classifier(root: Path) -> Path:
    return tiny_cross_encoder(root, labels=3, initializer_range=0.3, segment_ids=True)


def _gme_own_code(root: Path) -> Path:
    """GME whose config.json names its reference code (`auto_map`), which the server never runs."""
    directory = tiny_gme(root)
    config = json.loads((directory / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "gme_inference.GmeQwen2VL"}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _nomic_multimodal(root: Path) -> Path:
    """nomic-embed-multimodal's adapter directory with its base model laid inside it, which the
    entry names relatively (`base_model: base`)."""
    parts = tiny_nomic_multimodal(root.parent / f"{root.name}-parts")
    shutil.copytree(parts["adapter"], root)
    shutil.copytree(parts["base"], root / "base")
    return root


def _splade(root: Path) -> Path:
    return tiny_masked_lm(root, sparse_layout=True)


FAMILIES: tuple[Family, ...] = (
    Family(
        "BERT embedder",
        ("sentence-transformers/all-MiniLM-L6-v2", "BAAI/bge-small-en-v1.5"),
        tiny_bert,
        "dense",
        "bert",
        "dense",
        ref.sentence_transformers(),
        ("dense",),
    ),
    Family(
        "XLM-R embedder",
        ("intfloat/multilingual-e5-base", "Snowflake/snowflake-arctic-embed-l-v2.0"),
        tiny_xlmr,
        "dense",
        "xlm-roberta",
        "dense",
        ref.sentence_transformers(),
        ("dense",),
    ),
    Family(
        "BERT cross-encoder",
        ("cross-encoder/ms-marco-MiniLM-L6-v2",),
        tiny_cross_encoder,
        "reranker",
        "bert",
        "rerank",
        ref.cross_encoder(QUERY),
        ("cross-encoder",),
    ),
    Family(
        "XLM-R cross-encoder",
        ("BAAI/bge-reranker-v2-m3",),
        tiny_xlmr_cross_encoder,
        "reranker",
        "xlm-roberta",
        "rerank",
        ref.cross_encoder(QUERY),
        ("cross-encoder",),
    ),
    Family(
        "BERT classifier",
        ("ProsusAI/finbert",),
        _classifier,
        "classifier",
        "bert",
        "classify",
        ref.classifier(),
        ("classifier",),
    ),
    Family(
        "SPLADE",
        ("naver/splade-cocondenser-ensembledistil",),
        _splade,
        "sparse",
        "bert",
        "sparse",
        ref.splade(),
        ("splade",),
    ),
    Family(
        "ColBERT (colbert-ai)",
        ("colbert-ir/colbertv2.0",),
        tiny_colbert,
        "multivector",
        "bert",
        "multivector",
        ref.colbert_ai(),
        ("colbert-ai",),
        queries=True,
    ),
    Family(
        "ColBERT (PyLate)",
        ("answerdotai/answerai-colbert-small-v1",),
        _answerai,
        "multivector",
        "bert",
        "multivector",
        ref.pylate(),
        ("pylate",),
        queries=True,
    ),
    Family(
        "ColBERT (PyLate, ModernBERT)",
        ("lightonai/GTE-ModernColBERT-v1",),
        tiny_modern_colbert,
        "multivector",
        "modernbert",
        "multivector",
        ref.pylate(),
        ("pylate",),
        queries=True,
    ),
    Family(
        "BGE-M3",
        ("BAAI/bge-m3",),
        tiny_bge_m3,
        "multi_output",
        "xlm-roberta",
        "multi_output",
        ref.bge_m3(),
        ("bge-m3",),
    ),
    Family(
        "ModernBERT embedder, CLS",
        ("Alibaba-NLP/gte-modernbert-base",),
        tiny_gte_modernbert,
        "dense",
        "modernbert",
        "dense",
        ref.sentence_transformers(),
        ("dense",),
    ),
    Family(
        "ModernBERT embedder, mean and prompts",
        ("nomic-ai/modernbert-embed-base",),
        tiny_modernbert_embedder,
        "dense",
        "modernbert",
        "dense",
        ref.sentence_transformers(),
        ("dense",),
        queries=True,
    ),
    Family(
        "ModernBERT cross-encoder",
        ("Alibaba-NLP/gte-reranker-modernbert-base",),
        tiny_modernbert_cross_encoder,
        "reranker",
        "modernbert",
        "rerank",
        ref.cross_encoder(QUERY),
        ("cross-encoder",),
    ),
    Family(
        "nomic-embed-text",
        ("nomic-ai/nomic-embed-text-v1.5",),
        tiny_nomic,
        "dense",
        "nomic_bert",
        "dense",
        ref.mean_pooled({"document": "", "query": NOMIC_PROMPTS["query"]}),
        ("native-port", "dense"),
        queries=True,
    ),
    Family(
        "Qwen3-Embedding",
        ("Qwen/Qwen3-Embedding-0.6B", "Qwen/Qwen3-Embedding-4B", "Qwen/Qwen3-Embedding-8B"),
        tiny_qwen3_embedding,
        "dense",
        "qwen3",
        "dense",
        ref.sentence_transformers(),
        ("dense",),
    ),
    Family(
        "EmbeddingGemma",
        ("google/embeddinggemma-300m",),
        tiny_embeddinggemma,
        "dense",
        "gemma3_text",
        "dense",
        ref.sentence_transformers(),
        ("dense",),
        queries=True,
    ),
    Family(
        "jina-embeddings-v3",
        ("jinaai/jina-embeddings-v3",),
        tiny_jina_v3,
        "dense",
        "jina_embeddings_v3",
        "dense",
        ref.jina_v3(),
        ("jina-lora-port", "dense", "jina-lora"),
        texts=tuple(ref.JINA_SENTENCES),
    ),
    Family(
        "gte-multilingual",
        ("Alibaba-NLP/gte-multilingual-base",),
        tiny_gte_multilingual,
        "dense",
        "gte",
        "dense",
        ref.gte_multilingual(),
        ("native-port", "dense"),
        texts=tuple(ref.GTE_SENTENCES),
    ),
    Family(
        "a model with code of its own, trusted",
        ("any checkpoint whose `auto_map` names its own modeling code",),
        tiny_remote_code_model,
        "dense",
        "bert",
        "dense",
        ref.remote_code(),
        ("remote-code", "dense"),
        entry={"trust_remote_code": True},
        texts=tuple(ref.REMOTE_SENTENCES),
        own_code=True,
    ),
    Family(
        "an embedder with a LoRA adapter (PEFT)",
        ("any embedder with LoRA adapters trained by PEFT, listed in its entry",),
        tiny_bert_with_adapter,
        "dense",
        "bert",
        "dense",
        ref.peft_merged("adapters/legal"),
        ("dense", "peft-adapters"),
        entry={"adapters": {"legal": "adapters/legal"}, "options": {"default_adapter": "legal"}},
        torch_only="adapters: torch only",
    ),
    Family(
        "Qwen3-Reranker",
        ("Qwen/Qwen3-Reranker-0.6B", "Qwen/Qwen3-Reranker-4B", "Qwen/Qwen3-Reranker-8B"),
        tiny_qwen3_reranker,
        "reranker",
        "qwen3",
        "rerank",
        ref.qwen3_reranker(QUERY),
        ("llm-reranker",),
        entry={"kind": "reranker", "template": "qwen3-reranker"},
        architectures=("Qwen3ForCausalLM",),
    ),
    Family(
        "bge-reranker-v2-gemma",
        ("BAAI/bge-reranker-v2-gemma",),
        tiny_gemma_reranker,
        "reranker",
        "gemma",
        "rerank",
        ref.gemma_reranker(QUERY),
        ("llm-reranker",),
        entry={"kind": "reranker", "template": "bge-reranker-v2-gemma"},
        architectures=("GemmaForCausalLM",),
    ),
    Family(
        "mxbai-rerank-v2",
        ("mixedbread-ai/mxbai-rerank-base-v2", "mixedbread-ai/mxbai-rerank-large-v2"),
        tiny_mxbai_reranker,
        "reranker",
        "qwen2",
        "rerank",
        ref.mxbai_reranker(QUERY),
        ("llm-reranker",),
        entry={"kind": "reranker", "template": "mxbai-rerank-v2"},
        architectures=("Qwen2ForCausalLM",),
    ),
    Family(
        "LLM reranker with a pair chat template",
        ("tomaarsen/Qwen3-Reranker-0.6B-seq-cls",),
        _pair_template_reranker,
        "reranker",
        "qwen3",
        "rerank",
        ref.cross_encoder(QUERY),
        ("llm-reranker-template", "llm-reranker"),
        architectures=("Qwen3ForCausalLM",),
    ),
    Family(
        "model2vec static model",
        ("minishlab/potion-base-8M", "minishlab/potion-retrieval-32M"),
        tiny_potion,
        "dense",
        "model2vec",
        "dense",
        ref.model2vec(),
        ("model2vec",),
        texts=(*TEXTS, "qqq hello qqq"),  # `qqq` is the unknown token, which model2vec drops
        engineless=True,
    ),
    Family(
        "sentence-transformers StaticEmbedding",
        (
            "sentence-transformers/static-retrieval-mrl-en-v1",
            "sentence-transformers/static-similarity-mrl-multilingual-v1",
        ),
        tiny_static_embedding,
        "dense",
        "static_embedding",
        "dense",
        ref.sentence_transformers(),
        ("static-embedding",),
        engineless=True,
    ),
    Family(
        "inference-free sparse (Router)",
        ("opensearch-project/opensearch-neural-sparse-encoding-doc-v3-distill",),
        tiny_inference_free_sparse,
        "sparse",
        "distilbert",
        "sparse",
        ref.router(),
        ("sparse-static", "splade"),
        queries=True,
    ),
    Family(
        "inference-free sparse, gte (Router)",
        ("opensearch-project/opensearch-neural-sparse-encoding-doc-v3-gte",),
        tiny_inference_free_gte,
        "sparse",
        "gte",
        "sparse",
        ref.beside(ref.router(), "-reference"),
        ("sparse-static", "native-port", "splade"),
        queries=True,
    ),
    Family(
        "dense Router (static queries)",
        ("sentence-transformers Router.for_query_document models",),
        tiny_dense_router,
        "dense",
        "bert",
        "dense",
        ref.router(),
        ("static-embedding", "dense"),
        queries=True,
    ),
    Family(
        "CLIP",
        ("openai/clip-vit-base-patch32",),
        tiny_clip,
        "image_text",
        "clip",
        "image_text",
        ref.clip(PICTURES),
        ("media",),
    ),
    Family(
        "open_clip",
        ("laion/CLIP-ViT-B-32-laion2B-s34B-b79K",),
        tiny_open_clip,
        "image_text",
        "open_clip",
        "image_text",
        ref.open_clip_model(PICTURES),
        ("open-clip",),
    ),
    Family(
        "SigLIP 2",
        ("google/siglip2-base-patch16-224",),
        tiny_siglip2,
        "image_text",
        "siglip",
        "image_text",
        ref.siglip2(PICTURES),
        ("media",),
    ),
    Family(
        "Qwen3-VL-Embedding",
        ("Qwen/Qwen3-VL-Embedding-2B",),
        tiny_qwen3_vl_embedding,
        "dense",
        "qwen3_vl",
        "image_text",
        ref.qwen3_vl_embedding(PICTURES),
        ("media", "qwen3-vl-embedding"),
    ),
    Family(
        "Qwen3-VL-Reranker",
        ("Qwen/Qwen3-VL-Reranker-2B",),
        tiny_qwen3_vl_reranker,
        "reranker",
        "qwen3_vl",
        "rerank",
        ref.qwen3_vl_reranker(QUERY),
        ("qwen3-vl-reranker",),
        entry={"kind": "reranker"},
        torch_only="vision-language: torch only",
    ),
    Family(
        "GME",
        ("Alibaba-NLP/gme-Qwen2-VL-2B-Instruct",),
        tiny_gme,
        "dense",
        "qwen2_vl",
        "image_text",
        ref.gme(PICTURES),
        ("media", "gme"),
    ),
    Family(
        "GME (own code named)",
        ("GME with an `auto_map` naming its code",),
        _gme_own_code,
        "dense",
        "qwen2_vl",
        "image_text",
        ref.gme(PICTURES),
        ("media", "gme-own-code", "gme"),
    ),
    Family(
        "jina-embeddings-v4",
        ("jinaai/jina-embeddings-v4",),
        tiny_jina_v4,
        "dense",
        "qwen2_5_vl",
        "image_text",
        ref.jina_v4(PICTURES),
        ("media", "jina-v4-own-code", "jina-v4"),
        architectures=("JinaEmbeddingsV4Model",),
    ),
    Family(
        "nomic-embed-multimodal",
        ("nomic-ai/nomic-embed-multimodal-3b", "nomic-ai/nomic-embed-multimodal-7b"),
        _nomic_multimodal,
        "dense",
        "qwen2_5_vl",
        "image_text",
        ref.nomic_multimodal(PICTURES),
        ("nomic-multimodal-adapter",),
        entry={"base_model": "base"},
    ),
    Family(
        "SigLIP 2 NaFlex",
        ("google/siglip2-base-patch16-naflex",),
        tiny_siglip2_naflex,
        "image_text",
        "siglip2",
        "image_text",
        ref.siglip2(PICTURES),
        ("media", "siglip2-naflex"),
    ),
)


def data_uri(picture: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(picture).decode()


def refusal(engine: str, family: Family, device: str = "cpu") -> str | None:
    """Why `engine` does not serve `family` (a phrase for the table), None where it does: the
    engine tables' own rule (`choice.check_model`), said short."""
    if family.engineless:
        return "static, runs on numpy"
    if engine == "torch":
        return None
    if family.torch_only is not None:
        return family.torch_only
    try:
        choice.check_model("m", engine, "none", family.kind, family.config, device)
    except ValueError:
        pass
    else:
        return None
    if family.llm_reranker:
        return "LLM rerankers: torch only"
    if family.own_code:
        return "not its own code"
    declared = backends.facts(engine)
    if declared.kinds is not None and family.kind not in declared.kinds:
        return f"no {family.kind} models"
    if declared.architectures is not None and family.architecture not in declared.architectures:
        return f"no '{family.architecture}'"
    only = declared.only.get(family.architecture, frozenset())
    return f"'{family.architecture}' as {', '.join(sorted(only))} only"


def engines(family: Family) -> tuple[str, ...]:
    """The engines that serve `family` on a CPU, by the engine tables; the matrix runs each."""
    return tuple(e for e in ENGINES if refusal(e, family) is None)


def auto_picks(family: Family, host: str) -> str:
    """The engine `auto` runs `family` on for a device class with every engine installed."""
    if family.llm_reranker or family.torch_only:  # its adapter keeps it on torch
        return "torch"
    if family.engineless:
        return "numpy"
    return choice.auto_engine(host, HOSTS[host], family.kind, family.architecture, family.config)


def table() -> str:
    """The matrix as docs/text-zoo.md shows it: per family, each engine (✔, or why not) and the
    engine `auto` takes on each device class."""
    hosts = list(HOSTS)
    head = ["family", "published examples", *(ENGINE_NAMES[e] for e in ENGINES)]
    head += [f"`auto`: {HOST_NAMES.get(h, h.upper())}" for h in hosts]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for family in FAMILIES:
        cells = [family.name, ", ".join(e if " " in e else f"`{e}`" for e in family.examples)]
        cells += ["✔" if (why := refusal(e, family)) is None else f"no: {why}" for e in ENGINES]
        cells += [ENGINE_NAMES[auto_picks(family, h)] for h in hosts]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
