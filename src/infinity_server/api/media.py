"""Media routes: image and audio embeddings and image rerank, from URLs, data URIs and uploads.

- `modality: image | audio` on `/v1/embeddings` and `/embeddings` (called from the OpenAI module);
- Infinity's `POST /embeddings_image` and `POST /embeddings_audio`;
- `POST /v1/embeddings/upload`: multipart/form-data with a `model` field and the files (and any
  `input` text fields), embedded in the order they appear;
- `POST /v1/rerank/images` (JSON, URLs or data URIs) and `POST /v1/rerank/images/upload`
  (multipart: `model`, `query`, files): pages or photos ranked against a text query, by cosine for
  CLIP-style models and by MaxSim for ColPali.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from infinity_server.api.common import encode_vector, json_response, parse_body, registry_of, until_disconnected
from infinity_server.api.openai import dense_matrix, matryoshka
from infinity_server.errors import HTTPError
from infinity_server.media import FetchPolicy, MediaFetcher
from infinity_server.media_limits import FetchGate
from infinity_server.schemas.media import MediaEmbeddingRequest, MediaRerankRequest
from infinity_server.schemas.openai import EmbeddingRequest
from infinity_server.settings import ServerSettings
from model_registry.errors import InvalidInput, UnsupportedOperation
from model_registry.types import Content, Embedding, Media, Modality, Output, Results, Score, Text

_MAX_FORM_FIELDS = 64


def fetcher_of(request: Request) -> MediaFetcher:
    """A fetcher for this request, sharing the server's fetch slots and byte budget."""
    server: ServerSettings = request.app.state.settings.server
    policy = FetchPolicy(
        allow_private=server.media_allow_private,
        allowed_hosts=frozenset(h.lower() for h in server.media_allowed_hosts),
        max_bytes=server.media_max_bytes,
        timeout=server.media_fetch_timeout,
        max_redirects=server.media_max_redirects,
        max_urls=server.media_max_urls_per_request,
        concurrency=server.media_fetch_concurrency,
        max_inputs=request.app.state.registry.config.max_inputs_per_request,
    )
    state = request.app.state
    if getattr(state, "fetch_gate", None) is None:
        state.fetch_gate = FetchGate(server.media_max_fetches, server.media_max_bytes_in_flight)
    return MediaFetcher(policy, gate=state.fetch_gate)


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    raise InvalidInput("image and audio inputs must be URLs or data URIs (strings), not token ids", param="input")


def embedding_list(model: str, results: Results, encoding_format: str, dimensions: int | None) -> Response:
    """The OpenAI list shape: one dense vector per input (cut to `dimensions` if asked)."""
    vectors = dense_matrix(results)
    vectors = matryoshka(vectors, dimensions, vectors.shape[1])
    data = [
        {"object": "embedding", "embedding": encode_vector(row, encoding_format), "index": i}
        for i, row in enumerate(vectors)
    ]
    usage = {"prompt_tokens": results.tokens, "total_tokens": results.tokens}
    return json_response({"object": "list", "data": data, "model": model, "usage": usage})


async def _embed_urls(
    request: Request, model: str, values: list[str], modality: Modality, priority: int | None
) -> Results:
    registry = registry_of(request)
    registry.info(model)  # an unknown model is a 404 before anything is fetched
    async with fetcher_of(request).loaded(values, modality) as media:
        return await until_disconnected(request, registry.embed(model, media, priority=priority))


async def embed_media(request: Request, body: EmbeddingRequest) -> Response:
    """`/v1/embeddings` and `/embeddings` with `modality: image | audio`."""
    results = await _embed_urls(request, body.model, _texts(body.input), Modality(body.modality), body.priority)
    return embedding_list(body.model, results, body.encoding_format, body.dimensions)


def _infinity_route(modality: Modality) -> Any:
    async def route(request: Request) -> Response:
        body = await parse_body(request, MediaEmbeddingRequest)
        results = await _embed_urls(request, body.model, body.inputs(), modality, body.priority)
        return embedding_list(body.model, results, body.encoding_format, body.dimensions)

    route.__name__ = f"embeddings_{modality.value}"
    return route


# ---- multipart ---------------------------------------------------------------------------------


async def read_form(request: Request) -> FormData:
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise HTTPError(
            415,
            "this route takes multipart/form-data (e.g. curl -F model=... -F file=@photo.jpg)",
            code="unsupported_media_type",
        )
    server: ServerSettings = request.app.state.settings.server
    limit = request.app.state.registry.config.max_inputs_per_request
    return await request.form(max_files=limit, max_fields=_MAX_FORM_FIELDS, max_part_size=server.media_max_bytes)


def field(form: FormData, name: str, *, required: bool = False) -> str | None:
    value = form.get(name)
    if value is None or value == "":
        if required:
            raise HTTPError(422, f"the form field '{name}' is required", code="invalid_body", param=name)
        return None
    if not isinstance(value, str):
        raise HTTPError(422, f"the form field '{name}' must be text, not a file", code="invalid_body", param=name)
    return value


def _modality(upload: UploadFile, declared: str | None, index: int) -> Modality:
    if declared is not None:
        if declared not in ("image", "audio"):
            raise InvalidInput(f"modality must be image or audio for uploads, got '{declared}'", param="modality")
        return Modality(declared)
    major = (upload.content_type or "").partition("/")[0]
    if major in ("image", "audio"):
        return Modality(major)
    raise InvalidInput(
        f"input {index}: the file '{upload.filename}' has content type '{upload.content_type}'; "
        "send an image/* or audio/* file, or set the 'modality' field",
        param="input",
    )


async def uploaded_contents(form: FormData, limit: int, declared: str | None) -> list[Content]:
    """Files and `input` text fields, in form order; other fields are options, not inputs."""
    contents: list[Content] = []
    for name, value in form.multi_items():
        if isinstance(value, UploadFile):
            index = len(contents)
            data = await value.read(limit + 1)
            if len(data) > limit:
                raise InvalidInput(f"input {index}: the file is larger than the limit of {limit:,} bytes")
            contents.append(Media(_modality(value, declared, index), data, source=value.filename or ""))
        elif name == "input":
            contents.append(Text(value))
    if not contents:
        raise InvalidInput("the form holds no files (and no 'input' text fields)", param="input")
    return contents


def _multivector_list(model: str, results: Results, encoding_format: str) -> Response:
    data = []
    for i, result in enumerate(results.items):
        if not isinstance(result, Embedding) or result.multivector is None:
            raise UnsupportedOperation("This is a bug: the model returned no multi-vector")
        vectors = result.multivector
        entry = {"object": "embedding", "embedding": encode_vector(vectors, encoding_format), "index": i}
        data.append({**entry, "shape": list(vectors.shape)})
    usage = {"prompt_tokens": results.tokens, "total_tokens": results.tokens}
    return json_response({"object": "list", "data": data, "model": model, "usage": usage})


async def upload(request: Request) -> Response:
    """`POST /v1/embeddings/upload`: fields model, [modality], [encoding_format], [output], [dimensions]."""
    form = await read_form(request)
    try:
        model = field(form, "model", required=True) or ""
        registry = registry_of(request)
        registry.info(model)
        limit = request.app.state.settings.server.media_max_bytes
        contents = await uploaded_contents(form, limit, field(form, "modality"))
        output = Output(_choice(form, "output", ("dense", "multivector")))
        encoding = _choice(form, "encoding_format", ("float", "base64"))
        results = await until_disconnected(request, registry.embed(model, contents, outputs=(output,)))
    finally:
        await form.close()
    if output == Output.MULTIVECTOR:
        return _multivector_list(model, results, encoding)
    return embedding_list(model, results, encoding, number(form, "dimensions"))


def number(form: FormData, name: str) -> int | None:
    """An optional positive integer form field."""
    value = field(form, name)
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise InvalidInput(f"{name} must be a positive integer, got '{value}'", param=name)
    return int(value)


def _choice(form: FormData, name: str, accepted: Sequence[str]) -> str:
    value = field(form, name) or accepted[0]
    if value not in accepted:
        raise InvalidInput(f"{name} must be one of {', '.join(accepted)}, got '{value}'", param=name)
    return value


# ---- rerank --------------------------------------------------------------------------------------


def rerank_response(model: str, results: Results, top_n: int | None, documents: Sequence[str] | None) -> Response:
    scores = np.array([r.value if isinstance(r, Score) else np.nan for r in results.items], dtype=np.float64)
    order = np.argsort(-scores, kind="stable")[: top_n or len(scores)]
    ranked = []
    for i in order.tolist():
        entry: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if documents is not None:
            entry["document"] = documents[i]
        ranked.append(entry)
    usage = {"prompt_tokens": results.tokens, "total_tokens": results.tokens}
    return json_response({"object": "rerank", "results": ranked, "model": model, "usage": usage})


async def rerank_images(request: Request) -> Response:
    body = await parse_body(request, MediaRerankRequest)
    registry = registry_of(request)
    registry.info(body.model)
    async with fetcher_of(request).loaded(body.documents, Modality.IMAGE) as media:
        work = registry.rerank_media(body.model, body.query, media, priority=body.priority)
        results = await until_disconnected(request, work)
    return rerank_response(body.model, results, body.top_n, body.documents if body.return_documents else None)


async def rerank_images_upload(request: Request) -> Response:
    """Multipart: fields model, query, [top_n]; the files are the documents."""
    form = await read_form(request)
    try:
        model = field(form, "model", required=True) or ""
        query = field(form, "query", required=True) or ""
        registry = registry_of(request)
        registry.info(model)
        limit = request.app.state.settings.server.media_max_bytes
        contents = await uploaded_contents(form, limit, "image")
        media = [c for c in contents if isinstance(c, Media)]
        top_n = number(form, "top_n")
        results = await until_disconnected(request, registry.rerank_media(model, query, media))
    finally:
        await form.close()
    names = [m.source for m in media]
    return rerank_response(model, results, top_n, names)


routes = [
    Route("/embeddings_image", _infinity_route(Modality.IMAGE), methods=["POST"]),
    Route("/embeddings_audio", _infinity_route(Modality.AUDIO), methods=["POST"]),
    Route("/v1/embeddings/upload", upload, methods=["POST"]),
    Route("/v1/rerank/images", rerank_images, methods=["POST"]),
    Route("/v1/rerank/images/upload", rerank_images_upload, methods=["POST"]),
]
