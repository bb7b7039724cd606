"""(method, path, request model, response model) of every dialect route, for the OpenAPI document.

Bodies that are not JSON objects (TEI's bare arrays) are `list[...]` types; `None` means no JSON
body (GET routes, multipart uploads). `infinity_server/openapi.py` builds its table from this.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from infinity_server.schemas import cohere, encode, infinity, media, openai, tei, vllm


class RouteSchema(NamedTuple):
    method: str
    path: str
    request: Any
    response: Any


_TEI_ROOT = tei.TeiEmbedRequest | tei.TeiPredictRequest | tei.TeiSimilarityRequest
_TEI_ROOT_ANSWER = tei.TeiEmbedResponse | tei.TeiSparseResponse | tei.TeiPredictResponse | tei.TeiSimilarityResponse

DIALECT_ROUTES: tuple[RouteSchema, ...] = (
    RouteSchema("POST", "/v1/embeddings", openai.EmbeddingRequest, openai.EmbeddingResponse),
    RouteSchema("POST", "/embeddings", openai.EmbeddingRequest, openai.EmbeddingResponse),
    RouteSchema("GET", "/v1/models", None, openai.ModelList),
    RouteSchema("GET", "/models", None, openai.ModelList),
    RouteSchema("POST", "/embeddings_image", media.MediaEmbeddingRequest, openai.EmbeddingResponse),
    RouteSchema("POST", "/embeddings_audio", media.MediaEmbeddingRequest, openai.EmbeddingResponse),
    RouteSchema("POST", "/v1/embeddings/upload", None, openai.EmbeddingResponse),
    RouteSchema("POST", "/v1/rerank/images", media.MediaRerankRequest, media.MediaRerankResponse),
    RouteSchema("POST", "/v1/rerank/images/upload", None, media.MediaRerankResponse),
    RouteSchema(
        "POST",
        "/rerank",
        infinity.RerankRequest | tei.TeiRerankRequest,
        infinity.RerankResponse | tei.TeiRerankResponse,
    ),
    RouteSchema("POST", "/classify", infinity.ClassifyRequest, infinity.ClassifyResponse),
    RouteSchema("POST", "/v1/encode", encode.EncodeRequest, encode.EncodeResponse),
    RouteSchema("POST", "/v1/rerank", cohere.CohereRerankRequest, cohere.CohereRerankResponse),
    RouteSchema("POST", "/v2/rerank", cohere.CohereRerankRequest, cohere.CohereRerankResponse),
    RouteSchema("POST", "/v1/embed", cohere.CohereEmbedRequest, cohere.CohereEmbedResponse),
    RouteSchema("POST", "/v2/embed", cohere.CohereEmbedRequest, cohere.CohereEmbedResponse),
    RouteSchema("POST", "/", _TEI_ROOT, _TEI_ROOT_ANSWER),
    RouteSchema("POST", "/models/{name}", _TEI_ROOT, _TEI_ROOT_ANSWER),
    RouteSchema("POST", "/embed", tei.TeiEmbedRequest, tei.TeiEmbedResponse),
    RouteSchema("POST", "/embed_sparse", tei.TeiEmbedRequest, tei.TeiSparseResponse),
    RouteSchema("POST", "/embed_all", tei.TeiEmbedRequest, tei.TeiEmbedAllResponse),
    RouteSchema("POST", "/predict", tei.TeiPredictRequest, tei.TeiPredictResponse),
    RouteSchema("POST", "/similarity", tei.TeiSimilarityRequest, tei.TeiSimilarityResponse),
    RouteSchema("POST", "/tokenize", tei.TeiTokenizeRequest, tei.TeiTokenizeResponse),
    RouteSchema("POST", "/decode", tei.TeiDecodeRequest, tei.TeiDecodeResponse),
    RouteSchema("GET", "/info", None, tei.TeiInfo),
    RouteSchema("POST", "/score", vllm.ScoreRequest, vllm.ScoreResponse),
    RouteSchema("POST", "/v1/score", vllm.ScoreRequest, vllm.ScoreResponse),
    RouteSchema("POST", "/pooling", vllm.PoolingRequest, vllm.PoolingResponse),
)

#: The error bodies: TEI's routes answer `TeiError`, every other route OpenAI's shape.
ERROR_BODIES = {"tei": tei.TeiError}
