"""Known published models: what their files cannot say, and what their model cards say.

A record is used when a model's `source` names its id (`org/name`, with or without `@revision`):
its `keys` become the entry's defaults, under whatever the YAML sets. Only keys the files cannot
carry are applied (an LLM reranker's kind and prompt record); the other facts (prompts, pooling,
lengths) are read from the model's own files when it loads and are listed here so that
`infinity-server models --catalogue` and `GET /v1/catalogue` tell what to expect.

`architecture` is the `model_type` the server runs the model as (a native port's, where one
serves it; `static_embedding` for sentence-transformers' StaticEmbedding, which has none);
`backends.choice.fastest_by_device` joins it with the engines measured fastest per device, for the
listings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class Record:
    """One published model id and what serving it right takes."""

    id: str
    kind: str
    #: ModelSpec keys applied under the YAML when a source matches.
    keys: Mapping[str, Any] = field(default_factory=dict)
    pooling: str | None = None
    max_length: int | None = None
    #: prompt name -> text prepended to the input (as sentence-transformers names them).
    prompts: Mapping[str, str] = field(default_factory=dict)
    #: LLM rerankers: the prompt record of `model_registry.zoo.rerank_templates` and its yes/no tokens.
    template: str | None = None
    true_token: str | None = None
    false_token: str | None = None
    #: ColBERT: tokens a query is expanded to, and a document truncated at.
    query_length: int | None = None
    document_length: int | None = None
    #: Code outside transformers' releases the checkpoint names (`trust_remote_code` needed).
    remote_code: bool = False
    architecture: str = ""
    #: The engine that runs it on every device, where none is chosen: "numpy" for a static model
    #: (`adapters/static.py`); empty where `backend: auto` chooses one per device.
    engine: str = ""
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["keys"], data["prompts"] = dict(self.keys), dict(self.prompts)
        return {key: value for key, value in data.items() if value not in (None, "", {}, False)}


_QWEN3_QUERY = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
_GEMMA_PROMPTS = {"query": "task: search result | query: ", "document": "title: none | text: "}
_NOMIC_PROMPTS = {
    "query": "search_query: ",
    "document": "search_document: ",
    "clustering": "clustering: ",
    "classification": "classification: ",
}
_MODERNBERT_PROMPTS = {"query": "search_query: ", "document": "search_document: "}
_JINA_QUERY = "Represent the query for retrieving evidence documents: "
_JINA_PASSAGE = "Represent the document for retrieval: "


def _qwen3_embedding(size: str) -> Record:
    return Record(
        f"Qwen/Qwen3-Embedding-{size}",
        "dense",
        {"kind": "dense"},
        pooling="lasttoken",
        max_length=32768,
        prompts={"query": _QWEN3_QUERY},
        architecture="qwen3",
        note="decoder embedder: last token, left padding; the query prompt carries the task instruction",
    )


def _static(model_id: str, architecture: str, note: str) -> Record:
    return Record(
        model_id, "dense", {"kind": "dense"}, pooling="mean", architecture=architecture, engine="numpy", note=note
    )


_MODEL2VEC = (
    "model2vec static model: the mean of its tokens' vectors as StaticModel.encode computes it (normalised where "
    "config.json's normalize says), cut at config.json's max_length (512 where it names none); numpy, no engine"
)
_INFERENCE_FREE = (
    "inference-free sparse (a sentence-transformers Router): queries weighted by its IDF table on numpy, "
    "documents by SPLADE (log1p_relu, max); the side follows prompt_name or input_type, documents by default"
)
_ST_STATIC = (
    "sentence-transformers StaticEmbedding (an EmbeddingBag mean), as SentenceTransformer.encode computes it; "
    "trained for Matryoshka cuts (`dimensions`); numpy, no engine"
)


def _llm_reranker(model_id: str, architecture: str, template: str, true: str, false: str | None, note: str) -> Record:
    return Record(
        model_id,
        "reranker",
        {"kind": "reranker", "template": template},
        template=template,
        true_token=true,
        false_token=false,
        architecture=architecture,
        note=note,
    )


_QWEN3_RERANK = "causal LM scored by p(yes) over the 'yes'/'no' logits after the model card's template"
_RECORDS: tuple[Record, ...] = (
    *(_qwen3_embedding(size) for size in ("0.6B", "4B", "8B")),
    *(
        _llm_reranker(f"Qwen/Qwen3-Reranker-{size}", "qwen3", "qwen3-reranker", "yes", "no", _QWEN3_RERANK)
        for size in ("0.6B", "4B", "8B")
    ),
    _llm_reranker(
        "BAAI/bge-reranker-v2-gemma",
        "gemma",
        "bge-reranker-v2-gemma",
        "Yes",
        None,
        "gemma causal LM scored by the 'Yes' logit after its A/B prompt",
    ),
    *(
        _llm_reranker(
            f"mixedbread-ai/mxbai-rerank-{size}-v2",
            "qwen2",
            "mxbai-rerank-v2",
            "1",
            "0",
            "qwen2 causal LM scored by '1'/'0'",
        )
        for size in ("base", "large")
    ),
    Record(
        "BAAI/bge-m3",
        "multi_output",
        {"kind": "multi_output"},
        max_length=8192,
        architecture="xlm-roberta",
        note="dense, sparse and ColBERT outputs from one forward pass (FlagEmbedding layout)",
    ),
    Record(
        "BAAI/bge-reranker-v2-m3",
        "reranker",
        {"kind": "reranker"},
        architecture="xlm-roberta",
        note="XLM-R cross-encoder, one label",
    ),
    Record(
        "google/embeddinggemma-300m",
        "dense",
        {"kind": "dense"},
        pooling="mean",
        max_length=2048,
        prompts=_GEMMA_PROMPTS,
        architecture="gemma3_text",
        note="bidirectional gemma3_text; two Dense layers after mean pooling",
    ),
    Record(
        "Alibaba-NLP/gte-modernbert-base",
        "dense",
        {"kind": "dense"},
        pooling="cls",
        max_length=8192,
        architecture="modernbert",
        note="ModernBERT, CLS pooling",
    ),
    Record(
        "nomic-ai/modernbert-embed-base",
        "dense",
        {"kind": "dense"},
        pooling="mean",
        max_length=8192,
        prompts=_MODERNBERT_PROMPTS,
        architecture="modernbert",
        note="ModernBERT, mean pooling, search_query/search_document prefixes",
    ),
    Record(
        "nomic-ai/nomic-embed-text-v1.5",
        "dense",
        {"kind": "dense"},
        pooling="mean",
        max_length=8192,
        prompts=_NOMIC_PROMPTS,
        architecture="nomic_bert",
        note="served by transformers' native nomic_bert port: no remote code needed",
    ),
    Record(
        "Alibaba-NLP/gte-multilingual-base",
        "dense",
        {"kind": "dense"},
        pooling="cls",
        max_length=8192,
        architecture="gte",
        note="new-impl layout (model_type 'new') served by transformers' native gte port: no remote code needed",
    ),
    Record(
        "jinaai/jina-embeddings-v3",
        "dense",
        {"kind": "dense"},
        pooling="mean",
        max_length=8192,
        prompts={"retrieval.query": _JINA_QUERY, "retrieval.passage": _JINA_PASSAGE},
        architecture="jina_embeddings_v3",
        note="XLM-R with LoRA task adapters (XLMRobertaLoRA) served by transformers' native jina_embeddings_v3 "
        "port, no remote code needed; `task` per request (retrieval.query, retrieval.passage, separation, "
        "classification, text-matching), `options.default_task` for requests that name none; torch or ONNX "
        "Runtime (the adapters in the graph)",
    ),
    Record(
        "lightonai/GTE-ModernColBERT-v1",
        "multivector",
        {"kind": "multivector"},
        query_length=32,
        document_length=300,
        architecture="modernbert",
        note="PyLate layout: [Q]/[D] prefixes, query expansion, Dense 768->128",
    ),
    Record(
        "answerdotai/answerai-colbert-small-v1",
        "multivector",
        {"kind": "multivector"},
        architecture="bert",
        note="PyLate layout on a BERT encoder; lengths from its configuration",
    ),
    Record(
        "google/siglip2-base-patch16-224",
        "image_text",
        {"kind": "image_text"},
        architecture="siglip",
        note="SigLIP 2, fixed resolution",
    ),
    Record(
        "google/siglip2-base-patch16-naflex",
        "image_text",
        {"kind": "image_text"},
        architecture="siglip2",
        note="SigLIP 2 NaFlex: variable-aspect patches up to max_num_patches",
    ),
    Record(
        "opensearch-project/opensearch-neural-sparse-encoding-doc-v3-distill",
        "sparse",
        {"kind": "sparse"},
        architecture="distilbert",
        note=_INFERENCE_FREE + "; documents by a DistilBERT masked LM",
    ),
    Record(
        "opensearch-project/opensearch-neural-sparse-encoding-doc-v3-gte",
        "sparse",
        {"kind": "sparse"},
        architecture="gte",
        note=_INFERENCE_FREE + "; documents by a gte masked LM on transformers' gte port (no hub code)",
    ),
    _static("minishlab/potion-base-8M", "model2vec", _MODEL2VEC),
    _static("minishlab/potion-retrieval-32M", "model2vec", _MODEL2VEC + "; tuned for retrieval"),
    _static("sentence-transformers/static-retrieval-mrl-en-v1", "static_embedding", _ST_STATIC),
    _static(
        "sentence-transformers/static-similarity-mrl-multilingual-v1", "static_embedding", _ST_STATIC + "; multilingual"
    ),
    Record(
        "sentence-transformers/all-MiniLM-L6-v2",
        "dense",
        {"kind": "dense"},
        pooling="mean",
        max_length=256,
        architecture="bert",
        note="BERT, mean pooling, normalized",
    ),
)
RECORDS: Mapping[str, Record] = MappingProxyType({record.id: record for record in _RECORDS})
_FOLDED = {model_id.casefold(): record for model_id, record in RECORDS.items()}


def match(source: str) -> Record | None:
    """The record whose id `source` names (`org/name` or `org/name@revision`), if any."""
    repo = source.partition("@")[0].strip()
    return _FOLDED.get(repo.casefold())


def with_record(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A model entry with its record's keys as defaults (the entry's own keys win)."""
    record = match(str(entry.get("source", "")))
    return {**record.keys, **entry} if record else dict(entry)
