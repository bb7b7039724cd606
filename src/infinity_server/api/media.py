"""Media routes: image and audio embeddings and image rerank, from URLs, data URIs and uploads.

- `modality: image | audio` on the OpenAI and Infinity embeddings routes (the OpenAI module);
- Infinity's image and audio embeddings routes;
- the embeddings upload route: multipart/form-data with a `model` field and the files (and any
  `input` text fields), embedded in the order they appear; a PDF given to a page model is embedded
  page by page, each page's entry naming its `input` and `page`;
- image rerank, as JSON (URLs or data URIs) or as an upload (multipart: `model`, `query`, files):
  pages or photos ranked against a text query, by cosine for CLIP-style models and by MaxSim for
  ColPali.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request

from infinity_server.api.common import fetched_media, registry_of
from infinity_server.api.openai import embedding_list
from infinity_server.encoding import column, encode_vectors, numbers_in
from infinity_server.errors import HTTPError
from infinity_server.routing import Vectors, post
from infinity_server.schemas.media import MediaEmbeddingRequest, MediaRerankRequest
from infinity_server.schemas.responses import (
    EmbeddingData,
    EmbeddingResponse,
    EmbeddingUpload,
    ImageRerankResponse,
    ImageRerankUpload,
    RerankResult,
    Usage,
)
from model_registry import Content, InvalidInput, Media, Modality, Output, Registry, Results, Score, Text, is_pdf


def _infinity_route(
    modality: Modality,
) -> Callable[[Request, MediaEmbeddingRequest], Awaitable[Vectors[EmbeddingResponse]]]:
    async def route(request: Request, body: MediaEmbeddingRequest) -> Vectors[EmbeddingResponse]:
        async with fetched_media(request, body.model, body.inputs(), modality) as media:
            results = await registry_of(request).embed(
                body.model, media, priority=body.priority, dimensions=body.dimensions
            )
        return Vectors(lambda: embedding_list(body.model, results, body.encoding_format), numbers_in(results))

    route.__name__ = f"embeddings_{modality.value}"
    return route


# ---- multipart ---------------------------------------------------------------------------------


def field(form: FormData, name: str, *, required: bool = False) -> str | None:
    value = form.get(name)
    if value is None or value == "":
        if required:
            raise HTTPError(422, f"the form field '{name}' is required", code="invalid_body", param=name)
        return None
    if not isinstance(value, str):
        raise HTTPError(422, f"the form field '{name}' must be text, not a file", code="invalid_body", param=name)
    return value


@dataclass(frozen=True)
class _Document:
    """An uploaded PDF, rendered to its pages before the request is embedded."""

    data: bytes
    source: str


def _is_document(upload: UploadFile, data: bytes) -> bool:
    return upload.content_type == "application/pdf" or (
        upload.content_type in (None, "application/octet-stream") and is_pdf(data)
    )


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


async def uploaded_contents(form: FormData, limit: int, declared: str | None) -> list[Content | _Document]:
    """Files and `input` text fields, in form order; other fields are options, not inputs."""
    contents: list[Content | _Document] = []
    for name, value in form.multi_items():
        if isinstance(value, UploadFile):
            index = len(contents)
            data = await value.read(limit + 1)
            if len(data) > limit:
                raise InvalidInput(f"input {index}: the file is larger than the limit of {limit:,} bytes")
            if _is_document(value, data):
                contents.append(_Document(data, value.filename or ""))
                continue
            contents.append(Media(_modality(value, declared, index), data, source=value.filename or ""))
        elif name == "input":
            contents.append(Text(value))
    if not contents:
        raise InvalidInput("the form holds no files (and no 'input' text fields)", param="input")
    return contents


def _multivector_list(model: str, results: Results, encoding_format: str) -> EmbeddingResponse:
    matrices = column(results, "multivector")
    encoded = encode_vectors(matrices, "float32", encoding_format)
    data: list[EmbeddingData] = [
        {"object": "embedding", "embedding": e, "index": i, "shape": list(m.shape)}
        for i, (m, e) in enumerate(zip(matrices, encoded, strict=True))
    ]
    usage: Usage = {"prompt_tokens": results.tokens, "total_tokens": results.tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


async def upload(request: Request, form: FormData) -> Vectors[EmbeddingResponse]:
    """Fields model, [modality], [encoding_format], [output], [dimensions]; the files are the inputs."""
    model = field(form, "model", required=True) or ""
    registry = registry_of(request)
    registry.info(model)
    limit = request.app.state.settings.server.media_max_bytes
    uploaded = await uploaded_contents(form, limit, field(form, "modality"))
    output = Output(_choice(form, "output", ("dense", "multivector")))
    encoding = _choice(form, "encoding_format", ("float", "base64"))
    dimensions = number(form, "dimensions")
    contents, origins = await _pages(registry, model, uploaded)
    results = await registry.embed(model, contents, outputs=(output,), dimensions=dimensions)
    if output == Output.MULTIVECTOR:
        return Vectors(lambda: _paged(_multivector_list(model, results, encoding), origins), numbers_in(results))
    return Vectors(lambda: _paged(embedding_list(model, results, encoding), origins), numbers_in(results))


async def _pages(
    registry: Registry, model: str, uploaded: Sequence[Content | _Document]
) -> tuple[list[Content], list[tuple[int, int] | None]]:
    """The inputs with each PDF replaced by its pages, and where each came from: (input, page) for a
    page, None for an input given as it is. The request's PDFs share `max_pdf_pages` between them."""
    contents: list[Content] = []
    origins: list[tuple[int, int] | None] = []
    left = registry.config.max_pdf_pages
    for index, item in enumerate(uploaded):
        if not isinstance(item, _Document):
            contents.append(item)
            origins.append(None)
            continue
        pages = await registry.pages(model, item.data, index, max_pages=left)
        left -= len(pages)
        contents.extend(page.image for page in pages)
        origins.extend((index, page.number) for page in pages)
    return contents, origins


def _paged(response: EmbeddingResponse, origins: Sequence[tuple[int, int] | None]) -> EmbeddingResponse:
    """Each page's entry names its input and its page number (from 1)."""
    for entry, origin in zip(response["data"], origins, strict=True):
        if origin is not None:
            entry["input"], entry["page"] = origin
    return response


def number(form: FormData, name: str) -> int | None:
    """An optional positive integer form field, in ASCII digits (str.isdigit also takes '²')."""
    value = field(form, name)
    if value is None:
        return None
    if not (value.isascii() and value.isdigit() and len(value) <= 9) or int(value) < 1:
        raise InvalidInput(f"{name} must be a positive integer below 10^9, got '{value[:20]}'", param=name)
    return int(value)


def _choice(form: FormData, name: str, accepted: Sequence[str]) -> str:
    value = field(form, name) or accepted[0]
    if value not in accepted:
        raise InvalidInput(f"{name} must be one of {', '.join(accepted)}, got '{value}'", param=name)
    return value


# ---- rerank --------------------------------------------------------------------------------------


def rerank_response(
    model: str, results: Results, top_n: int | None, documents: Sequence[str] | None
) -> ImageRerankResponse:
    scores = [r.value if isinstance(r, Score) else float("-inf") for r in results.items]
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[: top_n or len(scores)]
    ranked = []
    for i in order:
        entry: RerankResult = {"index": i, "relevance_score": scores[i]}
        if documents is not None:
            entry["document"] = documents[i]
        ranked.append(entry)
    usage: Usage = {"prompt_tokens": results.tokens, "total_tokens": results.tokens}
    return {"object": "rerank", "results": ranked, "model": model, "usage": usage}


async def rerank_images(request: Request, body: MediaRerankRequest) -> ImageRerankResponse:
    async with fetched_media(request, body.model, body.documents, Modality.IMAGE) as media:
        results = await registry_of(request).rerank_media(body.model, body.query, media, priority=body.priority)
    return rerank_response(body.model, results, body.top_n, body.documents if body.return_documents else None)


async def rerank_images_upload(request: Request, form: FormData) -> ImageRerankResponse:
    """Fields model, query, [top_n]; the files are the documents."""
    model = field(form, "model", required=True) or ""
    query = field(form, "query", required=True) or ""
    registry = registry_of(request)
    registry.info(model)
    limit = request.app.state.settings.server.media_max_bytes
    contents = await uploaded_contents(form, limit, "image")
    media = [c for c in contents if isinstance(c, Media)]
    top_n = number(form, "top_n")
    results = await registry.rerank_media(model, query, media)
    return rerank_response(model, results, top_n, [m.source for m in media])


_IMAGE, _AUDIO = "Image embeddings from URLs or data URIs", "Audio embeddings from URLs or data URIs"
operations = [
    post("/embeddings_image", _infinity_route(Modality.IMAGE), _IMAGE),
    post("/embeddings_audio", _infinity_route(Modality.AUDIO), _AUDIO),
    post("/v1/embeddings/upload", upload, "Embeddings of uploaded files", request=EmbeddingUpload),
    post("/v1/rerank/images", rerank_images, "Rank images against a query"),
    post("/v1/rerank/images/upload", rerank_images_upload, "Rank uploaded images", request=ImageRerankUpload),
]
