"""What every route shares: body parsing, fast JSON responses, disconnect-aware execution, media inputs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar, cast

import orjson
from starlette.convertors import Convertor, register_url_convertor
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from infinity_server.auth import PRIORITY, has_scope
from infinity_server.errors import HTTPError
from infinity_server.fetch import FetchGate, FetchPolicy, MediaFetcher, shared_media_client
from infinity_server.schemas.common import Body, InputParts
from infinity_server.settings import ServerSettings
from model_registry import (
    Cancelled,
    Capability,
    Content,
    InvalidInput,
    Media,
    Mixed,
    Modality,
    Registry,
    Text,
    check_span_count,
    is_pdf,
)

M = TypeVar("M", bound=Body)
T = TypeVar("T")
R = TypeVar("R")

_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


class ModelName(Convertor[str]):
    """`{name:model}`: any model name in a path, slashes and control characters included.

    Starlette's `path` convertor is `.*`, which stops at a newline, so a name holding one would
    miss its route and be answered "no route" in another dialect's shape instead of "no such
    model" in the route's own.
    """

    regex = "(?s:.*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("model", ModelName())


def registry_of(request: Request) -> Registry:
    registry: Registry = request.app.state.registry
    return registry


#: The model `infinity_client` sends when none is set: the server's choice, as a missing one.
NOT_SPECIFIED = "default/not-specified"
#: What a model must be able to do to be a route family's default.
FAMILY_CAPABILITIES: dict[str, frozenset[Capability]] = {
    "embed": frozenset({Capability.EMBED_TEXT}),
    "embed_sparse": frozenset({Capability.SPARSE}),
    "embed_all": frozenset({Capability.MULTIVECTOR}),
    "predict": frozenset({Capability.CLASSIFY, Capability.RERANK}),
    "rerank": frozenset({Capability.RERANK}),
}


def model_for(request: Request, asked: str | None, family: str) -> str:
    """The body's model, else the family's configured default, else the only served model, else the
    only served model that can serve the family."""
    if asked is not None:
        return asked
    configured: dict[str, str] = request.app.state.settings.server.default_models
    if family in configured:
        return configured[family]
    registry = registry_of(request)
    names = registry.names()
    if len(names) == 1:
        return names[0]
    able = [i.name for i in registry.infos() if i.capabilities & FAMILY_CAPABILITIES[family]]
    if len(able) == 1:
        return able[0]
    which = f"{len(able)} of them can serve it ({', '.join(able)})" if able else "none of them can serve it"
    raise InvalidInput(
        f"this server serves {len(names)} models ({', '.join(names)}) and {which}; name one in 'model', "
        f"or set server.default_models.{family} in the configuration",
        param="model",
    )


#: The request state's key for a priority set by the server in the engine's own terms (a batch
#: line's), which replaces whatever the body's dialect says.
ENGINE_PRIORITY = "engine_priority"
#: A body up to this size is parsed and validated on the event loop (well under a millisecond); a
#: larger one on a thread, so that no body stalls the other requests while it is read.
_ON_LOOP_BYTES = 64 * 1024


async def parse_body(request: Request, model: type[M], data: dict[str, Any] | None = None) -> M:
    """The JSON body (or `data`, already read from it) validated into `model`: malformed JSON or a
    wrong shape is a 422. Every body is validated here, so this is the one place where a priority
    is checked, in the engine's terms (`Body.engine_priority`): one above the default without the
    right to raise it is a 403, before anything else."""
    data = await read_object(request) if data is None else data
    _count_spans(request, data)
    if model.model_family is not None and data.get("model") in (None, NOT_SPECIFIED):
        data = {**data, "model": model_for(request, None, model.model_family)}
    takes_priority = "priority" in model.model_fields
    asked = data.get("priority")
    if takes_priority and isinstance(asked, int) and not isinstance(asked, bool):
        check_priority(request, model.engine_priority(asked), lower_first=model.lower_priority_first)
    if getattr(request.state, "body_bytes", 0) <= _ON_LOOP_BYTES:
        parsed = model.model_validate(data)
    else:
        parsed = await asyncio.to_thread(model.model_validate, data)
    forced = request.scope.get("state", {}).get(ENGINE_PRIORITY)
    if forced is not None and takes_priority:  # the server's own (a batch line's), in the engine's terms
        parsed = parsed.model_copy(update={"priority": forced})
    return parsed


def _count_spans(request: Request, data: dict[str, Any]) -> None:
    """Late chunking's span lists, counted before they are validated: each span is a Python object
    to validate, and 15 MB of them take seconds; the request's limit decides at a glance."""
    spans = data.get("spans")
    if not isinstance(spans, list):
        return
    limit = registry_of(request).config.max_chunks_per_request
    check_span_count(sum(len(s) if isinstance(s, list) else 1 for s in spans), limit)


def check_priority(request: Request, engine: int, *, lower_first: bool = False) -> None:
    """The engine's priority policy, made explicit: a request the policy would not give the priority
    it asks for (`engine`, in the engine's terms) is a 403 (a silent clamp would hide why it was not
    favoured). Lowering is free; raising above the default needs the `priority` scope or
    `allow_client_priority`, which the registry decides. The message says the number as the body
    did (Cohere's and vLLM's `priority`, `lower_first`, is the engine's negated)."""
    asked = -engine if lower_first else engine
    if registry_of(request).client_priority(engine, granted=has_scope(request.scope, PRIORITY)) != engine:
        free = "0 or more (lower numbers run first)" if lower_first else "0 or less"
        raise HTTPError(
            403,
            f"priority {asked} needs a key with the 'priority' scope (or server.allow_client_priority: true); "
            f"any client may ask for {free}",
            code="insufficient_scope",
            param="priority",
        )


async def read_object(request: Request) -> dict[str, Any]:
    """The JSON object in the body; an empty body, malformed JSON or another JSON value is a 422."""
    body = await request.body()
    request.state.body_bytes = len(body)
    if not body:
        raise HTTPError(422, "the request body is empty; a JSON object is expected", code="invalid_body")
    try:
        data = orjson.loads(body) if len(body) <= _ON_LOOP_BYTES else await asyncio.to_thread(orjson.loads, body)
    except orjson.JSONDecodeError as error:
        raise HTTPError(422, f"the request body is not valid JSON: {error}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise HTTPError(422, "the request body must be a JSON object", code="invalid_body")
    return data


def json_response(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """orjson with numpy support: float32 arrays are written without a Python float per value."""
    return Response(orjson.dumps(content, option=_JSON_OPTIONS), status, headers, media_type="application/json")


_MAX_FORM_FIELDS = 64


async def read_uploads(request: Request) -> FormData:
    """A multipart form of media uploads, bounded: at most a request's inputs in files, each at most
    `server.media_max_bytes` (`JsonContentType` has refused any other body type already)."""
    server: ServerSettings = request.app.state.settings.server
    limit = registry_of(request).config.max_inputs_per_request
    return await request.form(max_files=limit, max_fields=_MAX_FORM_FIELDS, max_part_size=server.media_max_bytes)


def fetcher_of(request: Request) -> MediaFetcher:
    """A fetcher for this request, sharing the server's fetch slots, byte budget and HTTP client."""
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
    client = shared_media_client(state, server.media_fetch_timeout)
    return MediaFetcher(policy, gate=state.fetch_gate, client=client)


@asynccontextmanager
async def fetched_media(
    request: Request, model: str, values: Sequence[str], modality: Modality
) -> AsyncIterator[list[Media]]:
    """URLs or data URIs as media, their bytes counted against the server's budget until the block
    ends (hold it around the engine call); an unknown model is a 404 before anything is fetched."""
    registry_of(request).info(model)
    async with fetcher_of(request).loaded(list(values), modality) as media:
        yield media


async def document_pages(
    registry: Registry, model: str, contents: Sequence[Content]
) -> tuple[list[Content], list[tuple[int, int] | None]]:
    """The inputs with each PDF (an image input whose bytes are one) replaced by its pages, rendered
    for the page model `model`, and where each came from: (input, page) for a page, None for an
    input as given. The request's PDFs share `max_pdf_pages` between them."""
    out: list[Content] = []
    origins: list[tuple[int, int] | None] = []
    left = registry.config.max_pdf_pages
    for index, item in enumerate(contents):
        if not (isinstance(item, Media) and item.modality == Modality.IMAGE and is_pdf(item.data)):
            out.append(item)
            origins.append(None)
            continue
        pages = await registry.pages(model, item.data, index, max_pages=left)
        left -= len(pages)
        out.extend(page.image for page in pages)
        origins.extend((index, page.number) for page in pages)
    return out, origins


def paged(response: R, origins: Sequence[tuple[int, int] | None]) -> R:
    """A list response (`data`, one entry per input) whose PDF pages' entries name their input and
    their page number (from 1)."""
    entries: list[dict[str, Any]] = cast(Any, response)["data"]
    for entry, origin in zip(entries, origins, strict=True):
        if origin is not None:
            entry["input"], entry["page"] = origin
    return response


@asynccontextmanager
async def engine_inputs(
    request: Request, model: str, modality: str, texts: Any, media: Callable[[], Sequence[str]]
) -> AsyncIterator[Any]:
    """`texts` for text, else the fetched `media()` values, held as `fetched_media` holds them.
    Input objects among texts (`InputParts`) become an image, or a text and an image together."""
    if modality == "text" and any(isinstance(t, InputParts) for t in texts):
        async with parted_inputs(request, model, texts) as contents:
            yield contents
        return
    if modality == "text":
        yield texts
        return
    async with fetched_media(request, model, media(), Modality(modality)) as fetched:
        yield fetched


@asynccontextmanager
async def parted_inputs(request: Request, model: str, values: Sequence[Any]) -> AsyncIterator[list[Any]]:
    """Texts and input objects as the engine's inputs: a string or `{text}` is a text, `{image}`
    an image, `{text, image}` both together (`Mixed`); the images are fetched as one batch, held
    as `fetched_media` holds them."""
    urls = [v.image for v in values if isinstance(v, InputParts) and v.image is not None]
    async with fetched_media(request, model, urls, Modality.IMAGE) as fetched:
        images = iter(fetched)
        contents: list[Any] = []
        for value in values:
            if not isinstance(value, InputParts):
                contents.append(value)
            elif value.image is None:
                contents.append(Text(value.text or ""))
            else:
                image = next(images)
                contents.append(image if value.text is None else Mixed(value.text, image))
        yield contents


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the client disconnects first (its queued items are dropped).

    `work` runs in the calling task, not in a task of its own that this one waits for: its result
    reaches the handler in the same turn of the event loop instead of two turns later. A watcher
    task cancels the caller on a disconnect, and that cancellation becomes `Cancelled` here."""
    task = asyncio.current_task()
    assert task is not None, "This is a bug: until_disconnected() runs in a task"
    gone = False

    async def watch() -> None:
        nonlocal gone
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                gone = True
                task.cancel()
                return

    watcher = asyncio.ensure_future(watch())
    try:
        result = await work
    except asyncio.CancelledError:
        if gone and _withdraw(task):  # ours alone, not also the server's (shutdown): the client left
            raise Cancelled("the client disconnected before the request finished") from None
        raise
    except BaseException:
        if gone:  # `work` turned the cancellation into its own error
            _withdraw(task)
        raise
    finally:
        watcher.cancel()
    if gone:  # `work` finished anyway
        _withdraw(task)
    return result


def _withdraw(task: asyncio.Task[Any]) -> bool:
    """Take back one cancellation of `task`; whether none is left (always, before Python 3.11,
    which does not count them)."""
    return not hasattr(task, "uncancel") or task.uncancel() == 0
