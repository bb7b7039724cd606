"""Each family's reference implementation, answering the questions its probe asks (see
`test_matrix.ask`) in the same order: the library the family is published for
(sentence-transformers, transformers) where it runs the model, the formulas of its own library
(PyLate, colbert-ai, FlagEmbedding, the model card's scoring) where it does not import.

A reference is built by a factory (`sentence_transformers()`) and called with the model's
directory; it returns one answer per question: an array of vectors or scores, or a sparse mapping.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.integration.test_siglip2 import reference as siglip2_reference
from tests.integration.zoo.test_gte import SENTENCES as GTE_SENTENCES
from tests.integration.zoo.test_gte import reference as gte_reference
from tests.integration.zoo.test_jina_v3 import SENTENCES as JINA_SENTENCES
from tests.integration.zoo.test_jina_v3 import reference as jina_reference
from tests.integration.zoo.test_llm_rerank import flag_llm_reranker, mxbai_rerank_v2, qwen3_card, reference, sigmoid
from tests.integration.zoo.test_pylate import reference as pylate_reference
from tests.integration.zoo.test_remote_code import SENTENCES as REMOTE_SENTENCES
from tests.integration.zoo.test_remote_code import reference as remote_reference
from tests.integration.zoo.test_sparse_multivector import colbert_reference, m3_reference, splade_reference

__all__ = ["GTE_SENTENCES", "JINA_SENTENCES", "REMOTE_SENTENCES"]

Answer = np.ndarray | dict[Any, float]
#: (the model's directory, the texts, whether queries are asked apart) -> the answers.
Reference = Callable[[Path, Sequence[str], bool], list[Answer]]


def sentence_transformers() -> Reference:
    """`SentenceTransformer.encode` of the documents, then of the queries behind the `query` prompt
    (where the model has one)."""

    def encode(directory: Path, texts: Sequence[str], queries: bool) -> list[Answer]:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(directory), device="cpu")
        answers: list[Answer] = [np.asarray(model.encode(list(texts)))]
        if queries:
            answers.append(np.asarray(model.encode(list(texts), prompt_name="query")))
        return answers

    return encode


def peft_merged(adapter: str) -> Reference:
    """`SentenceTransformer.encode` on PEFT's merge (`merge_and_unload`) of the adapter published
    in the model's `adapter` folder."""

    def encode(directory: Path, texts: Sequence[str], queries: bool) -> list[Answer]:
        from tests.builders.peft import merged

        return [np.asarray(merged(directory, directory / adapter).encode(list(texts)))]

    return encode


def router() -> Reference:
    """A Router model's `encode` (its default route) of the texts, then `encode_query` (its query
    route): `SparseEncoder`'s for a sparse model (its non-zero weights per text), else
    `SentenceTransformer`'s."""

    def encode(directory: Path, texts: Sequence[str], queries: bool) -> list[Answer]:
        from sentence_transformers import SentenceTransformer, SparseEncoder

        sparse = "SparseEncoder" in (directory / "config_sentence_transformers.json").read_text()
        model = (SparseEncoder if sparse else SentenceTransformer)(str(directory), device="cpu")
        batches = [model.encode(list(texts)), *([model.encode_query(list(texts))] if queries else [])]
        if not sparse:
            return [np.asarray(batch) for batch in batches]
        rows = [row for batch in batches for row in torch.as_tensor(batch).to_dense().numpy()]
        return [{int(i): float(row[i]) for i in np.flatnonzero(row)} for row in rows]

    return encode


def beside(reference: Reference, suffix: str) -> Reference:
    """`reference` run on the directory the builder kept beside the model's (`<dir><suffix>`): the
    same weights in a layout the reference library reads without the checkpoint's hub code."""
    return lambda directory, texts, queries: reference(directory.parent / f"{directory.name}{suffix}", texts, queries)


def model2vec() -> Reference:
    """model2vec's `StaticModel.encode` (its cuts, no special tokens, the unknown token dropped)."""

    def encode(directory: Path, texts: Sequence[str], queries: bool) -> list[Answer]:
        from model2vec import StaticModel

        return [np.asarray(StaticModel.from_pretrained(str(directory)).encode(list(texts)))]

    return encode


def mean_pooled(prompts: dict[str, str]) -> Reference:
    """transformers' model (its native port where one exists), mean pooled and normalised, each text
    alone behind the model's document, then query, prefix."""

    def encode(directory: Path, texts: Sequence[str], queries: bool) -> list[Answer]:
        from transformers import AutoModel, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(directory))
        model = AutoModel.from_pretrained(str(directory)).eval()
        answers: list[Answer] = []
        for prefix in [prompts["document"], *([prompts["query"]] if queries else [])]:
            rows = []
            with torch.inference_mode():
                for text in texts:
                    mean = model(**tokenizer(prefix + text, return_tensors="pt")).last_hidden_state[0].mean(dim=0)
                    rows.append((mean / mean.norm()).numpy())
            answers.append(np.stack(rows))
        return answers

    return encode


def jina_v3() -> Reference:
    """transformers' port with no task adapter merged: the answer to a request naming no task."""
    return lambda directory, texts, queries: [jina_reference(directory, None)]


def gte_multilingual() -> Reference:
    return lambda directory, texts, queries: [gte_reference(directory)]


def remote_code() -> Reference:
    """transformers running the checkpoint's own class (`trust_remote_code`), mean pooled."""
    return lambda directory, texts, queries: [remote_reference(directory)]


def cross_encoder(query: str) -> Reference:
    """`CrossEncoder.predict` on (query, document) pairs, with its default activation."""

    def predict(directory: Path, texts: Sequence[str], queries: bool) -> list[Answer]:
        from sentence_transformers import CrossEncoder

        model = CrossEncoder(str(directory), device="cpu")
        return [np.asarray(model.predict([(query, t) for t in texts]), dtype=np.float64)]

    return predict


def qwen3_reranker(query: str) -> Reference:
    """The model card: p(yes) over yes and no after its chat-formatted prompt."""
    return lambda directory, texts, queries: [
        reference(directory, [qwen3_card(query, t) for t in texts], "yes", "no")[0]
    ]


def gemma_reranker(query: str) -> Reference:
    """FlagEmbedding's `FlagLLMReranker.compute_score`, normalised by the sigmoid."""
    return lambda directory, texts, queries: [sigmoid(flag_llm_reranker(directory, query, list(texts)))]


def mxbai_reranker(query: str) -> Reference:
    """mxbai-rerank's `MxbaiRerankV2.predict`, normalised by the sigmoid."""
    return lambda directory, texts, queries: [sigmoid(mxbai_rerank_v2(directory, query, list(texts)))]


def classifier() -> Reference:
    """transformers' sequence classifier: per text, the softmax of its logits by label."""

    def classify(directory: Path, texts: Sequence[str], queries: bool) -> list[Answer]:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(directory))
        model = AutoModelForSequenceClassification.from_pretrained(str(directory)).eval()
        with torch.no_grad():
            logits = model(**tokenizer(list(texts), padding=True, return_tensors="pt")).logits
        labels = model.config.id2label
        return [{labels[i]: float(p) for i, p in enumerate(row)} for row in torch.softmax(logits, dim=-1)]

    return classify


def splade() -> Reference:
    """SPLADE's formula: the max over tokens of log(1 + relu(MLM logits)), each text alone."""
    return lambda directory, texts, queries: [splade_reference(directory, t) for t in texts]


def colbert_ai() -> Reference:
    """colbert-ai's encoding of documents, then of queries (marker, [MASK] expansion)."""

    def encode(directory: Path, texts: Sequence[str], queries: bool) -> list[Answer]:
        documents: list[Answer] = [colbert_reference(directory, t, query=False) for t in texts]
        return documents + [colbert_reference(directory, t, query=True) for t in texts]

    return encode


def pylate() -> Reference:
    """PyLate's encoding of documents, then of queries."""

    def encode(directory: Path, texts: Sequence[str], queries: bool) -> list[Answer]:
        documents: list[Answer] = list(pylate_reference(directory, list(texts), query=False))
        return documents + list(pylate_reference(directory, list(texts), query=True))

    return encode


def bge_m3() -> Reference:
    """FlagEmbedding's formulas: per text, its dense vector, lexical weights and ColBERT vectors."""

    def encode(directory: Path, texts: Sequence[str], queries: bool) -> list[Answer]:
        answers: list[Answer] = []
        for text in texts:
            dense, lexical, vectors = m3_reference(directory, text)
            answers += [dense, lexical, vectors]
        return answers

    return encode


def siglip2(pictures: Sequence[bytes]) -> Reference:
    """transformers' `get_text_features` of the texts, then `get_image_features` of the pictures."""

    def encode(directory: Path, texts: Sequence[str], queries: bool) -> list[Answer]:
        return [siglip2_reference(directory, texts=texts), siglip2_reference(directory, pictures=pictures)]

    return encode


def clip(pictures: Sequence[bytes]) -> Reference:
    """transformers' `CLIPModel`: the tokenizer's ids to `get_text_features`, the image processor's
    pixels to `get_image_features`."""

    def encode(directory: Path, texts: Sequence[str], queries: bool) -> list[Answer]:
        from transformers import AutoTokenizer, CLIPImageProcessor, CLIPModel

        model = CLIPModel.from_pretrained(directory).eval()
        tokenizer = AutoTokenizer.from_pretrained(directory)
        processor = CLIPImageProcessor.from_pretrained(directory)
        with torch.inference_mode():
            tokens = tokenizer(list(texts), padding=True, truncation=True, max_length=32, return_tensors="pt")
            text = model.get_text_features(**tokens).pooler_output.numpy()
            pixels = processor(images=[_rgb(p) for p in pictures], return_tensors="pt")
            image = model.get_image_features(**pixels).pooler_output.numpy()
        return [text, image]

    return encode


def open_clip_model(pictures: Sequence[bytes]) -> Reference:
    """open_clip's own model, tokenizer and preprocessing from the directory."""

    def encode(directory: Path, texts: Sequence[str], queries: bool) -> list[Answer]:
        import open_clip

        name = f"local-dir:{directory}"
        model, _, preprocess = open_clip.create_model_and_transforms(name)
        tokenizer = open_clip.get_tokenizer(name)
        model.eval()
        with torch.inference_mode():
            text = model.encode_text(tokenizer(list(texts))).numpy()
            image = model.encode_image(torch.stack([preprocess(_rgb(p)) for p in pictures])).numpy()
        return [text, image]

    return encode


def _rgb(picture: bytes) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(picture)).convert("RGB")


def qwen3_vl_embedding(pictures: Sequence[bytes]) -> Reference:
    """The texts, then the pictures, as Qwen3-VL-Embedding's official embedder builds and pools
    them (its test's reference: transformers' Qwen3-VL classes and the official recipe)."""

    def encode(directory: Path, texts: Sequence[str], queries: bool) -> list[Answer]:
        from tests.integration.zoo.test_qwen3_vl_embedding import Reference as Official

        model = Official(directory)
        return [model.embed([{"text": t} for t in texts])[0], model.embed([{"image": p} for p in pictures])[0]]

    return encode


def gme(pictures: Sequence[bytes]) -> Reference:
    """The texts, then the pictures, as GME's `gme_inference.py` builds and pools them (its test's
    reference: transformers' Qwen2-VL classes and the reference's recipe)."""

    def encode(directory: Path, texts: Sequence[str], queries: bool) -> list[Answer]:
        from tests.integration.zoo.test_gme import Reference as Official

        model = Official(directory)
        return [model.embed([{"text": t} for t in texts])[0], model.embed([{"image": p} for p in pictures])[0]]

    return encode


def nomic_multimodal(pictures: Sequence[bytes]) -> Reference:
    """The texts as queries, then the pictures, as colpali-engine's BiQwen2.5 makes them from the
    adapter merged into its base (`base` inside the adapter's directory; its test's reference)."""

    def encode(directory: Path, texts: Sequence[str], queries: bool) -> list[Answer]:
        from tests.integration.zoo.test_nomic_multimodal import Reference as Official

        model = Official(directory, directory / "base")
        return [model.queries(list(texts))[0], model.images(list(pictures))[0]]

    return encode


def qwen3_vl_reranker(query: str) -> Reference:
    """p(yes) of each (query, text) pair as Qwen3-VL-Reranker's official scorer gives it."""

    def score(directory: Path, texts: Sequence[str], queries: bool) -> list[Answer]:
        from tests.integration.zoo.test_qwen3_vl_reranker import Reference as Official

        return [Official(directory).score([{"text": t} for t in texts], query=query)[0]]

    return score


def jina_v4(pictures: Sequence[bytes]) -> Reference:
    """The texts (the retrieval task's query prompt, the defaults), then the pictures, as
    jina-embeddings-v4's `modeling_jina_embeddings_v4.py` builds and pools them (its test's
    reference: transformers' Qwen2.5-VL classes, the task's LoRA merged by PEFT, the recipe)."""

    def encode(directory: Path, texts: Sequence[str], queries: bool) -> list[Answer]:
        import tempfile

        from tests.integration.zoo.test_jina_v4 import Reference as Official

        with tempfile.TemporaryDirectory() as scratch:
            model = Official(directory, Path(scratch))
        dense = [np.stack([model.text(t).dense for t in texts]), np.stack([model.image(p).dense for p in pictures])]
        return list(dense)

    return encode
