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

from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request

from infinity_server.api.common import document_pages, fetched_media, paged, registry_of
from infinity_server.api.openai import embedding_list
from infinity_server.encoding import column, encode_vectors, numbers_in
from infinity_server.errors import HTTPError
from infinity_server.routing import Vectors, post
from infinity_server.schemas.common import InputParts
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
from model_registry import (
    Content,
    EmbedCall,
    InvalidInput,
    Media,
    Mixed,
    Modality,
    Output,
    Results,
    Score,
    Text,
    is_pdf,
)


def _infinity_route(
    modality: Modality,
) -> Callable[[Request, MediaEmbeddingRequest], Awaitable[Vectors[EmbeddingResponse]]]:
    async def route(request: Request, body: MediaEmbeddingRequest) -> Vectors[EmbeddingResponse]:
        registry = registry_of(request)
        async with fetched_media(request, body.model, body.inputs(), modality) as media:
            contents, origins = await document_pages(registry, body.model, media)
            results = await registry.embed_call(
                EmbedCall(body.model, contents, priority=body.priority, dimensions=body.dimensions)
            )
        return Vectors(
            lambda: paged(embedding_list(body.model, results, body.encoding_format), origins), numbers_in(results)
        )

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


async def uploaded_contents(form: FormData, limit: int, declared: str | None) -> list[Content]:
    """Files and `input` text fields, in form order; other fields are options, not inputs. A PDF is
    an image input until `document_pages` renders its pages."""
    contents: list[Content] = []
    for name, value in form.multi_items():
        if isinstance(value, UploadFile):
            index = len(contents)
            data = await value.read(limit + 1)
            if len(data) > limit:
                raise InvalidInput(f"input {index}: the file is larger than the limit of {limit:,} bytes")
            modality = Modality.IMAGE if _is_document(value, data) else _modality(value, declared, index)
            contents.append(Media(modality, data, source=value.filename or ""))
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
    """Fields model, [modality], [encoding_format], [output], [dimensions], [prompt_name], [task] or
    [adapter]; the files and `input` texts are the inputs."""
    model = field(form, "model", required=True) or ""
    registry = registry_of(request)
    registry.info(model)
    limit = request.app.state.settings.server.media_max_bytes
    uploaded = await uploaded_contents(form, limit, field(form, "modality"))
    output = Output(_choice(form, "output", ("dense", "multivector")))
    encoding = _choice(form, "encoding_format", ("float", "base64"))
    dimensions = number(form, "dimensions")
    contents, origins = await document_pages(registry, model, uploaded)
    call = EmbedCall(
        model,
        contents,
        outputs=(output,),
        dimensions=dimensions,
        prompt_name=field(form, "prompt_name"),
        task=_adapter_field(form),
    )
    results = await registry.embed_call(call)
    if output == Output.MULTIVECTOR:
        return Vectors(lambda: paged(_multivector_list(model, results, encoding), origins), numbers_in(results))
    return Vectors(lambda: paged(embedding_list(model, results, encoding), origins), numbers_in(results))


def _adapter_field(form: FormData) -> str | None:
    """`task` or `adapter`, the two names of the model's task adapter (one, or both the same)."""
    task, adapter = field(form, "task"), field(form, "adapter")
    if task is not None and adapter is not None and task != adapter:
        raise HTTPError(
            422, "'adapter' and 'task' choose the same thing, the model's adapter; send one", code="invalid_body"
        )
    return adapter if adapter is not None else task


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
    model: str,
    results: Results,
    top_n: int | None,
    documents: Sequence[str | dict[str, str]] | None,
    origins: Sequence[tuple[int, int] | None] | None = None,
) -> ImageRerankResponse:
    """Best first; a PDF document's pages are ranked each on its own, each result naming its
    document's index and its page (`origins`, as `document_pages` gives them)."""
    scores = [r.value if isinstance(r, Score) else float("-inf") for r in results.items]
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[: top_n or len(scores)]
    where = list(origins) if origins is not None else [None] * len(scores)
    ranked = []
    for i in order:
        origin = where[i]
        document = i if origin is None else origin[0]
        entry: RerankResult = {"index": document, "relevance_score": scores[i]}
        if origin is not None:
            entry["page"] = origin[1]
        if documents is not None:
            entry["document"] = documents[document]
        ranked.append(entry)
    usage: Usage = {"prompt_tokens": results.tokens, "total_tokens": results.tokens}
    return {"object": "rerank", "results": ranked, "model": model, "usage": usage}


async def rerank_images(request: Request, body: MediaRerankRequest) -> ImageRerankResponse:
    registry = registry_of(request)
    urls = [_image_of(i, d) for i, d in enumerate(body.documents)]
    async with fetched_media(request, body.model, urls, Modality.IMAGE) as media:
        documents: list[Content] = [
            Mixed(d.text, m) if isinstance(d, InputParts) and d.text is not None else m
            for d, m in zip(body.documents, media, strict=True)
        ]
        pages, origins = await document_pages(registry, body.model, documents)
        results = await registry.rerank_media(
            body.model,
            body.query,
            [p for p in pages if isinstance(p, Media | Mixed)],
            priority=body.priority,
            instruction=body.instruction,
        )
    shown = [d.model_dump(exclude_none=True) if isinstance(d, InputParts) else d for d in body.documents]
    return rerank_response(body.model, results, body.top_n, shown if body.return_documents else None, origins)


def _image_of(index: int, document: str | InputParts) -> str:
    """A document's image: the string itself, or an object's `image` (which it must have)."""
    if isinstance(document, str):
        return document
    if document.image is None:
        raise InvalidInput(
            f"document {index} has no image; an object document is an image with a text beside it "
            "({image, text}); rank texts alone with /rerank",
            param="documents",
        )
    return document.image


async def rerank_images_upload(request: Request, form: FormData) -> ImageRerankResponse:
    """Fields model, query, [top_n]; the files are the documents."""
    model = field(form, "model", required=True) or ""
    query = field(form, "query", required=True) or ""
    registry = registry_of(request)
    registry.info(model)
    limit = request.app.state.settings.server.media_max_bytes
    contents = await uploaded_contents(form, limit, "image")
    media = [c for c in contents if isinstance(c, Media)]
    pages, origins = await document_pages(registry, model, media)
    top_n = number(form, "top_n")
    results = await registry.rerank_media(model, query, [p for p in pages if isinstance(p, Media)])
    return rerank_response(model, results, top_n, [m.source for m in media], origins)


_IMAGE, _AUDIO = "Image embeddings from URLs or data URIs", "Audio embeddings from URLs or data URIs"
operations = [
    post("/embeddings_image", _infinity_route(Modality.IMAGE), _IMAGE),
    post("/embeddings_audio", _infinity_route(Modality.AUDIO), _AUDIO),
    post("/v1/embeddings/upload", upload, "Embeddings of uploaded files", request=EmbeddingUpload),
    post("/v1/rerank/images", rerank_images, "Rank images against a query"),
    post("/v1/rerank/images/upload", rerank_images_upload, "Rank uploaded images", request=ImageRerankUpload),
]
