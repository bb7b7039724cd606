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

from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from infinity_server.api.common import (
    fetched_media,
    json_response,
    parse_body,
    registry_of,
    until_disconnected,
    vectors_response,
)
from infinity_server.api.openai import embedding_list
from infinity_server.encoding import column, encode_vectors, numbers_in
from infinity_server.errors import HTTPError
from infinity_server.schemas.media import MediaEmbeddingRequest, MediaRerankRequest
from infinity_server.settings import ServerSettings
from model_registry import Content, InvalidInput, Media, Modality, Output, Results, Score, Text

_MAX_FORM_FIELDS = 64


def _infinity_route(modality: Modality) -> Any:
    async def route(request: Request) -> Response:
        body = await parse_body(request, MediaEmbeddingRequest)
        async with fetched_media(request, body.model, body.inputs(), modality) as media:
            work = registry_of(request).embed(body.model, media, priority=body.priority)
            results = await until_disconnected(request, work)
        return await vectors_response(
            lambda: embedding_list(body.model, results, body.encoding_format, body.dimensions), numbers_in(results)
        )

    route.__name__ = f"embeddings_{modality.value}"
    return route


# ---- multipart ---------------------------------------------------------------------------------


async def read_form(request: Request) -> FormData:
    """The multipart form, bounded (`JsonContentType` has refused any other body type already)."""
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


def _multivector_list(model: str, results: Results, encoding_format: str) -> dict[str, Any]:
    matrices = column(results, "multivector")
    encoded = encode_vectors(matrices, "float32", encoding_format)
    data = [
        {"object": "embedding", "embedding": e, "index": i, "shape": list(m.shape)}
        for i, (m, e) in enumerate(zip(matrices, encoded, strict=True))
    ]
    usage = {"prompt_tokens": results.tokens, "total_tokens": results.tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


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
    dimensions = number(form, "dimensions")
    if output == Output.MULTIVECTOR:
        return await vectors_response(lambda: _multivector_list(model, results, encoding), numbers_in(results))
    return await vectors_response(lambda: embedding_list(model, results, encoding, dimensions), numbers_in(results))


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
    scores = [r.value if isinstance(r, Score) else float("-inf") for r in results.items]
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[: top_n or len(scores)]
    ranked = []
    for i in order:
        entry: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if documents is not None:
            entry["document"] = documents[i]
        ranked.append(entry)
    usage = {"prompt_tokens": results.tokens, "total_tokens": results.tokens}
    return json_response({"object": "rerank", "results": ranked, "model": model, "usage": usage})


async def rerank_images(request: Request) -> Response:
    body = await parse_body(request, MediaRerankRequest)
    registry = registry_of(request)
    async with fetched_media(request, body.model, body.documents, Modality.IMAGE) as media:
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
