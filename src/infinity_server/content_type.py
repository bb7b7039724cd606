"""415 for a request body that is not of the type its route takes, or that is content-encoded,
before the route runs.

Every POST/PUT/PATCH route takes a JSON object except the upload routes, which declare
`multipart/form-data` (`routing.Operation.request_type`). A body sent as `text/plain` or as a form is
refused instead of being parsed as JSON anyway: a client that mislabels its body learns it at
once, and a browser's "simple" cross-site POST (which cannot set a JSON type without a CORS
preflight) never reaches a handler. A request with no body at all passes a JSON route (e.g. admin
actions). A body with a `Content-Encoding` other than `identity` (gzip, br...) is refused with
`Accept-Encoding: identity` (RFC 7694): the server does not inflate request bodies, since a few
compressed kilobytes could inflate past the body limit. Each refusal drops the unread body first,
so a kept-alive connection stays usable.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from infinity_server.body_limit import answer_unread
from infinity_server.errors import error_response, shape_of
from infinity_server.routing import MULTIPART, operation_in

_METHODS = frozenset({"POST", "PUT", "PATCH"})


def is_json(content_type: str) -> bool:
    """application/json or a structured `+json` type, with any parameters (charset...)."""
    media_type = content_type.partition(";")[0].strip().lower()
    return media_type == "application/json" or (media_type.startswith("application/") and media_type.endswith("+json"))


#: How much of a refused Content-Encoding the message repeats (a header may be kilobytes long).
_SHOWN = 64


def content_codings(headers: list[tuple[bytes, bytes]]) -> list[str]:
    """The content codings the request declares on its body, `identity` left out, across every
    Content-Encoding header (each a comma-separated list, as RFC 9110 allows)."""
    codings = [
        coding.strip().lower()
        for name, value in headers
        if name.lower() == b"content-encoding"
        for coding in value.decode("latin-1").split(",")
    ]
    return [c for c in codings if c and c != "identity"]


def _has_body(headers: dict[bytes, bytes]) -> bool:
    length = headers.get(b"content-length")
    if length is not None:
        return length.strip() not in (b"", b"0")
    return b"transfer-encoding" in headers


class JsonContentType:
    """Plain ASGI middleware: JSON routes answer 415 to a body of any other declared type, the
    upload routes to anything but multipart/form-data, and every route to a content-encoded body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _METHODS:
            await self.app(scope, receive, send)
            return
        codings = content_codings(scope["headers"])
        if codings:
            await _refuse_encoded(codings, scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-type", b"").decode("latin-1")
        op = operation_in(scope)
        if op is not None and op.request_type == MULTIPART:
            if declared.startswith("multipart/form-data"):
                await self.app(scope, receive, send)
                return
            message = "this route takes multipart/form-data (e.g. curl -F model=... -F file=@photo.jpg)"
        elif is_json(declared) or (not declared and not _has_body(headers)):
            await self.app(scope, receive, send)
            return
        else:
            shown = f"'{declared}'" if declared else "no content type"
            message = (
                f"this route takes a JSON body (Content-Type: application/json), but the request declares {shown}; "
                "file uploads go to the '/upload' routes as multipart/form-data"
            )
        response = error_response(415, message, code="unsupported_media_type", shape=shape_of(scope))
        await answer_unread(response, scope, receive, send)


async def _refuse_encoded(codings: list[str], scope: Scope, receive: Receive, send: Send) -> None:
    shown = ", ".join(codings)
    shown = shown if len(shown) <= _SHOWN else shown[:_SHOWN] + "..."
    message = (
        f"the request body is sent with Content-Encoding: {shown}; this server reads request bodies as sent "
        "(Content-Encoding: identity, or no such header) only: send the body uncompressed"
    )
    response = error_response(
        415,
        message,
        code="unsupported_content_encoding",
        headers={"Accept-Encoding": "identity"},
        shape=shape_of(scope),
    )
    await answer_unread(response, scope, receive, send)
