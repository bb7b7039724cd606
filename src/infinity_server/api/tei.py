"""Text Embeddings Inference's dialect: TEI's paths, bodies, bare-array answers and error shape.

Dense, sparse and per-token vectors, predictions, similarity, tokenize and decode, the default
model's info, the Hugging Face Inference API's root route (dispatched by the model's kind) and
rerank in TEI's shape (`query` + `texts`) beside Infinity's (`query` + `documents`) on the same
path. Errors are `{"error", "error_type"}` with the statuses of the one error table.

Which model: the body's `model` (or `?model=` on the info route); without it the route family's
`server.default_models` entry; without that, the only served model, or else the only one that can
serve the family (by its kind, known from its files before it loads). See docs/dialects/tei.md.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from infinity_server import __version__
from infinity_server.api import infinity, vllm
from infinity_server.api.common import model_for, parse_body, registry_of
from infinity_server.api.openai import late_spans
from infinity_server.encoding import column, dense_vectors, numbers_in, output_limit
from infinity_server.errors import HTTPError, Shape, answer_in
from infinity_server.routing import Vectors, get, post
from infinity_server.schemas.infinity import RerankRequest
from infinity_server.schemas.responses import RerankResponse, SpanVector
from infinity_server.schemas.tei import (
    TeiDecodeRequest,
    TeiEmbedAllResponse,
    TeiEmbedRequest,
    TeiEmbedResponse,
    TeiInfo,
    TeiModelType,
    TeiOptions,
    TeiPrediction,
    TeiPredictRequest,
    TeiPredictResponse,
    TeiRank,
    TeiRerankRequest,
    TeiRootRequest,
    TeiSimilarityRequest,
    TeiSparseResponse,
    TeiTokenizeRequest,
    TeiTokenizeResponse,
)
from infinity_server.schemas.vllm import VllmRerankRequest, VllmRerankResponse
from model_registry import Capability, EmbedCall, InvalidInput, Kind, ModelInfo, OutputLimit, RerankCall, Results, Token


def _direction(options: TeiOptions | Any) -> str:
    """TEI writes `Left`/`Right`; the engine takes left/right."""
    return str(options.truncation_direction).lower()


# ---- embeddings -----------------------------------------------------------------------------------


async def _embed_with(
    request: Request,
    body: TeiEmbedRequest,
    family: str,
    output: str,
    limit: OutputLimit | None = None,
    dimensions: int | None = None,
) -> Results:
    model = model_for(request, body.model, family)
    return await registry_of(request).embed_call(
        EmbedCall(
            model,
            _inputs(body),
            outputs=(output,),
            prompt_name=body.prompt_name,
            truncate=body.truncate,
            truncation_direction=_direction(body),
            output_limit=limit,
            priority=body.priority,
            long_inputs=body.long_inputs,
            spans=body.spans,
            dimensions=dimensions,
        )
    )


async def embed(request: Request, body: TeiEmbedRequest) -> Vectors[TeiEmbedResponse | list[list[SpanVector]]]:
    results = await _embed_with(request, body, "embed", "dense", dimensions=body.dimensions)
    if body.long_inputs == "late":
        answer = late_spans(results, _inputs(body), body.spans)
        return Vectors(lambda: answer, numbers_in(results))
    return Vectors(lambda: dense_vectors(results, normalize=body.normalize), numbers_in(results))


def _inputs(body: TeiEmbedRequest) -> list[Any]:
    """TEI's `inputs`: a text, texts, one token-id list or token-id lists (as the engine takes them)."""
    value = body.inputs
    if isinstance(value, str) or (value and isinstance(value[0], int)):
        return [value]
    return list(value)


async def embed_sparse(request: Request, body: TeiEmbedRequest) -> Vectors[TeiSparseResponse]:
    results = await _embed_with(request, body, "embed_sparse", "sparse")

    def build() -> TeiSparseResponse:
        return [
            [{"index": i, "value": v} for i, v in zip(s.indices.tolist(), s.values.tolist(), strict=True)]
            for s in column(results, "sparse")
        ]

    return Vectors(build, numbers_in(results))


async def embed_all(request: Request, body: TeiEmbedRequest) -> Vectors[TeiEmbedAllResponse]:
    limit = output_limit(request.app.state.settings.server.max_output_bytes)
    results = await _embed_with(request, body, "embed_all", "multivector", limit)
    return Vectors(lambda: column(results, "multivector"), numbers_in(results))


# ---- predict, rerank, similarity ------------------------------------------------------------------


def _sequences(inputs: Any) -> tuple[list[list[str]], bool]:
    """TEI's reading of `inputs` (its `PredictInput`): a text, or a list of strings, which is one
    text `[a]` or one pair `[a, b]` (the body refuses more), is one input; a list of lists is a
    batch. And whether it was a batch."""
    if isinstance(inputs, str):
        return [[inputs]], False
    if all(isinstance(v, str) for v in inputs):
        return [list(inputs)], False
    return [list(v) for v in inputs], True


def _predictions(info: ModelInfo, sequences: list[list[str]]) -> tuple[str, Any]:
    """Which engine operation serves these inputs on this model: classify texts and pairs (each
    input on its own, as TEI does, so a batch may hold both), or score pairs."""
    pairs = [len(s) == 2 for s in sequences]
    if Capability.CLASSIFY in info.capabilities:
        return "classify", [s[0] if len(s) == 1 else s for s in sequences]
    if not all(pairs):
        raise InvalidInput(f"the model '{info.name}' scores pairs; send each input as [query, text]", param="inputs")
    return "score", [(s[0], s[1]) for s in sequences]


async def predictions(
    request: Request, body: TeiPredictRequest, family: str = "predict"
) -> tuple[list[list[TeiPrediction]], bool]:
    """One list of `{score, label}` per input (best first, cut to `top_k`), and whether the body was a batch."""
    registry = registry_of(request)
    model = model_for(request, body.model, family)
    sequences, batch = _sequences(body.inputs)
    operation, inputs = _predictions(registry.info(model), sequences)
    options: dict[str, Any] = {
        "raw_scores": body.raw_scores,
        "truncate": body.truncate,
        "truncation_direction": _direction(body),
        "priority": body.priority,
    }
    if operation == "classify":
        result = await registry.classify(model, inputs, **options)
        kept = body.top_labels()
        return [[{"score": s.score, "label": s.label} for s in row[:kept]] for row in result.results], batch
    scored = await registry.score(model, inputs, **options)
    return [[{"score": s, "label": "LABEL_0"}] for s in scored.scores], batch


async def predict(request: Request, body: TeiPredictRequest) -> TeiPredictResponse:
    rows, batch = await predictions(request, body)
    return rows if batch else rows[0]


async def rerank(request: Request, body: dict[str, Any]) -> RerankResponse | list[TeiRank] | VllmRerankResponse:
    """TEI's shape (`texts`), Infinity's (`documents`) or vLLM's (a field only vLLM's rerank has)
    on one path; the body tells which."""
    if {"texts", "documents"} <= body.keys():
        raise HTTPError(
            422,
            "the body has both 'texts' (TEI's rerank) and 'documents' (Infinity's and Cohere's); send one",
            code="invalid_body",
            param="texts",
        )
    if "texts" in body:
        answer_in(request.scope, Shape.TEI)
        return await tei_rerank(request, await parse_body(request, TeiRerankRequest, body))
    if vllm.rerank_body(body, RerankRequest):
        return await vllm.rerank(request, await parse_body(request, VllmRerankRequest, body))
    return await infinity.rerank(request, await parse_body(request, RerankRequest, body))


async def tei_rerank(request: Request, body: TeiRerankRequest) -> list[TeiRank]:
    model = model_for(request, body.model, "rerank")
    ranking = await registry_of(request).rerank_call(
        RerankCall(
            model,
            body.query,
            body.texts,
            raw_scores=body.raw_scores,
            truncate=body.truncate,
            truncation_direction=_direction(body),
            weights=body.weights.model_dump() if body.weights is not None else None,
            return_parts=body.return_parts,
            priority=body.priority,
        )
    )
    ranks: list[TeiRank] = []
    for r in ranking.results:
        entry: TeiRank = {"index": r.index, "score": r.score}
        if body.return_text:
            entry["text"] = r.document
        if r.parts is not None:
            entry["parts"] = dict(r.parts)
        ranks.append(entry)
    return ranks


async def similarity(request: Request, body: TeiSimilarityRequest) -> list[float]:
    parameters = body.parameters
    truncate = parameters.truncate if parameters is not None else body.truncate
    direction = _direction(parameters) if parameters is not None else "right"
    model = model_for(request, body.model, "embed")
    source = body.inputs.source_sentence
    pairs = [(source, s) for s in body.inputs.sentences]
    scored = await registry_of(request).score(
        model, pairs, truncate=truncate, truncation_direction=direction, priority=body.priority
    )
    return list(scored.scores)


# ---- tokenize, decode, info -----------------------------------------------------------------------


#: The fewest bytes one token takes in the tokenize answer, its separator included: more tokens
#: than `max_output_bytes` over this cannot fit, whatever their texts.
_TOKEN_BYTES = len(orjson.dumps({"id": 0, "text": "", "special": False, "start": 0, "stop": 0})) + 1


async def tokenize(request: Request, body: TeiTokenizeRequest) -> Response:
    """Every token of each text, as TEI answers: never truncated, spans in UTF-8 bytes. The answer
    is bounded by `server.max_output_bytes`: tokenizing stops at the tokens that cannot fit, and
    the written answer is measured as it grows; either is a 400 before anything is sent."""
    model = model_for(request, body.model, "embed")
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    max_bytes: int = request.app.state.settings.server.max_output_bytes
    rows = await registry_of(request).tokenize(
        model,
        texts,
        add_special_tokens=body.add_special_tokens,
        prompt_name=body.prompt_name,
        byte_offsets=True,
        # Tokens that cannot fit in max_output_bytes, whatever their texts: refused as they are counted.
        max_tokens=max_bytes // _TOKEN_BYTES,
    )
    # 2,048 texts of 300 words are 32 MB of JSON: written off the event loop, a row at a time.
    return Response(await asyncio.to_thread(_token_rows, rows, max_bytes), media_type="application/json")


def _token_rows(rows: list[list[Token]], max_bytes: int) -> bytes:
    """TEI's tokenize answer, one row dumped at a time: each dump holds the interpreter for a row's
    tokens only, so the event loop runs between rows instead of waiting for the whole answer.
    An answer past `max_bytes` is `InvalidInput`, raised at the row that passes it."""
    dumped: list[bytes] = []
    size = 2
    for index, row in enumerate(rows):
        tokens = [{"id": t.id, "text": t.text, "special": t.special, "start": t.start, "stop": t.stop} for t in row]
        dumped.append(orjson.dumps(tokens))
        size += len(dumped[-1]) + 1
        if size > max_bytes:
            raise InvalidInput(
                f"the tokens of these inputs take more than the server's max_output_bytes ({max_bytes:,} bytes) "
                f"as JSON, passed at input {index}; send fewer or shorter inputs in each request",
                param="inputs",
            )
    return b"[" + b",".join(dumped) + b"]"


async def decode(request: Request, body: TeiDecodeRequest) -> list[str]:
    model = model_for(request, body.model, "embed")
    ids: Any = [body.ids] if body.ids and isinstance(body.ids[0], int) else body.ids
    decoded: list[str] = await registry_of(request).decode(model, ids, skip_special_tokens=body.skip_special_tokens)
    return decoded


def _model_type(info: ModelInfo) -> TeiModelType:
    if info.kind == Kind.CLASSIFIER:
        labels = list(info.extra.get("labels", []))
        return {
            "classifier": {
                "id2label": {str(i): n for i, n in enumerate(labels)},
                "label2id": {n: i for i, n in enumerate(labels)},
            }
        }
    if info.kind == Kind.RERANKER:
        return {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
    return {"embedding": {"pooling": str(info.extra.get("pooling", info.kind.value))}}


async def info(request: Request) -> TeiInfo:
    """The model as it is now, never loaded for the asking: a model not loaded yet is described from
    its configuration and files (its kind), and its length, labels and pooling show once it loads."""
    registry = registry_of(request)
    model = model_for(request, request.query_params.get("model"), "embed")
    described = registry.info(model)
    spec = registry.spec(model)
    server = request.app.state.settings.server
    budget = described.extra.get("batch_budget", {})
    return {
        "model_id": described.name,
        "model_sha": None,
        "model_dtype": described.dtype,
        "served_model_name": described.name,
        "model_type": _model_type(described),
        "max_input_length": described.max_length,
        "max_client_batch_size": registry.config.max_inputs_per_request,
        # The model's queue refuses (429) past this many inputs waiting; a request has one at least.
        "max_concurrent_requests": spec.max_queued_items,
        "max_batch_tokens": budget.get("tokens"),
        "max_batch_requests": None,
        "auto_truncate": spec.truncate,
        "tokenization_workers": registry.config.prepare_threads,
        "version": __version__,
        "sha": None,
        "docker_label": None,
        "max_body_bytes": server.max_body_bytes,
        "kind": described.kind.value,
        "capabilities": sorted(c.value for c in described.capabilities),
        "status": described.state.value,
    }


# ---- the Inference API's root route ---------------------------------------------------------------


async def root(
    request: Request, data: dict[str, Any]
) -> Vectors[TeiEmbedResponse | list[list[SpanVector]] | TeiSparseResponse | TeiPredictResponse | list[float]]:
    """The Hugging Face Inference API's route: similarity by its input's shape, else by the model's kind.

    Classifiers and rerankers answer as predict does in the batch shape (a list per input), as the
    Inference API does; sparse models answer as embed_sparse; every other model as embed. The
    named-model path (and its `/pipeline/{task}` suffix) is the same route for the model `name`,
    so that `InferenceClient(model=f"{url}/models/{name}")` reaches any served model.
    """
    named = request.path_params.get("name")
    if named is not None:
        data["model"] = named.partition("/pipeline/")[0]
    if isinstance(data.get("inputs"), dict):
        scores = await similarity(request, await parse_body(request, TeiSimilarityRequest, data))
        return Vectors(lambda: scores, 0)
    asked = data.get("model")
    model = model_for(request, asked if isinstance(asked, str) else None, "embed")
    if asked is None:  # the route below answers for this model, not its own family's default
        data["model"] = model
    described = registry_of(request).info(model)
    if described.capabilities & {Capability.CLASSIFY, Capability.RERANK}:
        rows, _ = await predictions(request, await parse_body(request, TeiPredictRequest, data))
        return Vectors(lambda: rows, 0)
    body = await parse_body(request, TeiEmbedRequest, data)
    if described.capabilities == {Capability.SPARSE}:
        return await embed_sparse(request, body)
    return await embed(request, body)


_TEI = {"shapes": (Shape.TEI,)}
_RERANK = {
    "model": "all-MiniLM-L6-v2",
    "query": "what is a vector database",
    "documents": ["an index of vectors", "a cake"],
    "return_documents": True,
}
operations = [
    post("/", root, "The route of the model's kind (TEI)", request=TeiRootRequest, **_TEI),
    post("/models/{name:model}", root, "The route of the named model's kind (TEI)", request=TeiRootRequest, **_TEI),
    post("/embed", embed, "Dense vectors (TEI)", **_TEI),
    post("/embed_sparse", embed_sparse, "Sparse vectors (TEI)", **_TEI),
    post("/embed_all", embed_all, "Per-token vectors (TEI)", **_TEI),
    post("/predict", predict, "Classify texts or pairs (TEI)", **_TEI),
    post(
        "/rerank",
        rerank,
        "Rerank (Infinity's, TEI's or vLLM's body)",
        request=RerankRequest | TeiRerankRequest | VllmRerankRequest,
        shapes=(Shape.OPENAI, Shape.TEI),
        batch=True,
        example=_RERANK,
    ),
    post("/similarity", similarity, "Sentence similarity (TEI)", **_TEI),
    post("/tokenize", tokenize, "Tokens of each input (TEI)", response=TeiTokenizeResponse, **_TEI),
    post("/decode", decode, "Texts of token ids (TEI)", **_TEI),
    get("/info", info, "The default model (TEI)", **_TEI),
]
