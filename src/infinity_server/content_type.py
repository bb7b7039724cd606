"""415 for a request body that is not declared as JSON on a JSON route.

Every POST/PUT/PATCH route takes a JSON object except the multipart upload routes (their paths end
in `/upload`; they check for `multipart/form-data` themselves). A body sent as `text/plain` or as a
form is refused instead of being parsed as JSON anyway: a client that mislabels its body learns it
at once, and a browser's "simple" cross-site POST (which cannot set a JSON type without a CORS
preflight) never reaches a handler. A request with no body at all passes (e.g. admin actions).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from infinity_server.body_limit import answer_unread
from infinity_server.errors import error_response, shape_of

_METHODS = frozenset({"POST", "PUT", "PATCH"})


def is_json(content_type: str) -> bool:
    """application/json or a structured `+json` type, with any parameters (charset...)."""
    media_type = content_type.partition(";")[0].strip().lower()
    return media_type == "application/json" or (media_type.startswith("application/") and media_type.endswith("+json"))


def _has_body(headers: dict[bytes, bytes]) -> bool:
    length = headers.get(b"content-length")
    if length is not None:
        return length.strip() not in (b"", b"0")
    return b"transfer-encoding" in headers


class JsonContentType:
    """Plain ASGI middleware: JSON routes answer 415 to a body of any other declared type."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _METHODS or scope["path"].endswith("/upload"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-type", b"").decode("latin-1")
        if is_json(declared) or (not declared and not _has_body(headers)):
            await self.app(scope, receive, send)
            return
        shown = f"'{declared}'" if declared else "no content type"
        message = (
            f"this route takes a JSON body (Content-Type: application/json), but the request declares {shown}; "
            "file uploads go to the '/upload' routes as multipart/form-data"
        )
        response = error_response(415, message, code="unsupported_media_type", shape=shape_of(scope))
        await answer_unread(response, scope, receive, send)
