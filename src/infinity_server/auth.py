"""API keys and scopes: which caller may reach which route.

A key is known by the sha256 digest of its secret only; a bearer token is hashed and compared
with `hmac.compare_digest` against every key (no early exit), so the time taken says nothing about
how close a guess was, and any bytes at all (non-ASCII, empty) are just a wrong key: 401.

Scopes: `inference` (every model route), `admin` (load, unload, memory), `metrics` (`/metrics`),
`priority` (ask for a priority above 0; any client may ask for 0 or less); each route declares the
one it needs (`routing.Operation.scope`): liveness, readiness and the API document are open. With
no key configured every caller holds every scope but `admin`.

Admin routes are off unless a key has the `admin` scope or `server.admin_routes` is true; off,
they answer 404 (`admin_disabled`) whoever asks, as if they did not exist.
After this middleware the ASGI scope carries `scope["state"]["scopes"]` and `["key_name"]`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from infinity_server.body_limit import answer_unread
from infinity_server.errors import error_response, shape_of
from infinity_server.routing import operation_in
from infinity_server.settings import ApiKeySpec, ServerSettings
from model_registry.config import format_validation_error
from model_registry.errors import ConfigError

INFERENCE, ADMIN, METRICS, PRIORITY = "inference", "admin", "metrics", "priority"
ALL_SCOPES = frozenset({INFERENCE, ADMIN, METRICS, PRIORITY})


def required_scope(scope: Scope) -> str | None:
    """The scope the request's route declares (None: open); a path no route has needs `inference`."""
    op = operation_in(scope)
    return INFERENCE if op is None else op.scope


@dataclass(frozen=True)
class Key:
    name: str
    digest: bytes
    scopes: frozenset[str]


@dataclass(frozen=True)
class KeyRing:
    """The configured keys and whether admin routes exist."""

    keys: tuple[Key, ...]
    admin_routes: bool

    def match(self, token: bytes) -> Key | None:
        digest = hashlib.sha256(token).digest()
        found = None
        for key in self.keys:  # every key is compared, so timing does not say which one matched
            if hmac.compare_digest(digest, key.digest):
                found = key
        return found

    @property
    def anonymous_scopes(self) -> frozenset[str]:
        """What a caller holds when no key is configured: admin only when explicitly enabled, and never
        `priority` (anyone could then starve everyone; `server.allow_client_priority` opens it)."""
        return (ALL_SCOPES if self.admin_routes else ALL_SCOPES - {ADMIN}) - {PRIORITY}


def _secret(spec: ApiKeySpec, environ: Mapping[str, str]) -> bytes:
    if spec.key is not None:
        return spec.key.encode()
    if spec.key_env is not None:
        value = environ.get(spec.key_env, "").strip()
        if not value:
            raise ConfigError(f"api key '{spec.name}': the environment variable {spec.key_env} is unset or empty")
        return value.encode()
    assert spec.key_file is not None, "This is a bug: ApiKeySpec validated exactly one source"
    try:
        value = Path(spec.key_file).read_text(encoding="utf-8").strip()
    except OSError as error:
        raise ConfigError(f"api key '{spec.name}': cannot read key_file '{spec.key_file}': {error.strerror}") from None
    if not value:
        raise ConfigError(f"api key '{spec.name}': key_file '{spec.key_file}' is empty")
    return value.encode()


def _digest(spec: ApiKeySpec, environ: Mapping[str, str]) -> bytes:
    if spec.sha256 is not None:
        return bytes.fromhex(spec.sha256)
    return hashlib.sha256(_secret(spec, environ)).digest()


def read_keys_file(path: str) -> tuple[ApiKeySpec, ...]:
    """The YAML list of key entries a Kubernetes Secret mounts (`server.api_keys_file`)."""
    try:
        data: Any = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(f"cannot read server.api_keys_file '{path}': {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"server.api_keys_file '{path}' is not valid YAML: {error}") from None
    if not isinstance(data, list):
        raise ConfigError(f"server.api_keys_file '{path}' must hold a YAML list of {{name, key|sha256|..., scopes}}")
    try:
        return TypeAdapter(tuple[ApiKeySpec, ...]).validate_python(data)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error, prefix="api_keys_file")) from None


def keyring(server: ServerSettings, environ: Mapping[str, str] | None = None) -> KeyRing:
    """Resolve every key source once, at start; a missing variable or file is a `ConfigError`."""
    environ = os.environ if environ is None else environ
    specs = list(server.api_keys)
    if server.api_keys_file:
        specs.extend(read_keys_file(server.api_keys_file))
    keys = [Key(s.name, _digest(s, environ), frozenset(s.scopes)) for s in specs]
    if server.api_key is not None:
        keys.append(Key("api_key", hashlib.sha256(server.api_key.encode()).digest(), ALL_SCOPES))
    names = [k.name for k in keys]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"server.api_keys: key names must be unique; repeated: {duplicates}")
    admin = server.admin_routes
    if admin is None:
        admin = any(ADMIN in k.scopes for k in keys)
    return KeyRing(tuple(keys), admin)


def bearer_token(scope: Scope) -> bytes | None:
    """The raw bytes after `Bearer ` in the Authorization header; None when there is none."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None


class Authenticate:
    """404 for disabled admin routes, 401 without a valid key, 403 for a key without the scope."""

    def __init__(self, app: ASGIApp, keys: KeyRing) -> None:
        self.app, self.keys = app, keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        needed = required_scope(scope)
        state = scope.setdefault("state", {})
        if needed == ADMIN and not self.keys.admin_routes:
            message = "admin routes are disabled; give a key the 'admin' scope or set server.admin_routes: true"
            response = error_response(404, message, code="admin_disabled", shape=shape_of(scope))
            await answer_unread(response, scope, receive, send)
            return
        if not self.keys.keys:
            state["scopes"], state["key_name"] = self.keys.anonymous_scopes, None
            await self.app(scope, receive, send)
            return
        token = bearer_token(scope)
        key = self.keys.match(token) if token else None
        if needed is not None and key is None:
            message = "a valid API key is required (Authorization: Bearer ...)"
            headers = {"WWW-Authenticate": "Bearer"}
            response = error_response(401, message, code="bad_key", headers=headers, shape=shape_of(scope))
            await answer_unread(response, scope, receive, send)
            return
        scopes = key.scopes if key is not None else frozenset()
        if needed is not None and needed not in scopes:
            message = f"the key '{key.name if key else ''}' lacks the '{needed}' scope this route needs"
            response = error_response(403, message, code="insufficient_scope", shape=shape_of(scope))
            await answer_unread(response, scope, receive, send)
            return
        state["scopes"], state["key_name"] = scopes, key.name if key else None
        await self.app(scope, receive, send)


def has_scope(scope: Scope, name: str) -> bool:
    """Whether the request's key has scope `name` (`Authenticate` puts the scopes on every request)."""
    return name in scope.get("state", {}).get("scopes", frozenset())
