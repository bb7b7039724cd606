"""Model entries from YAML (or dicts) -> validated, frozen specs.

Every mistake is reported with the key's path, the value given and what would be accepted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from model_registry.errors import ConfigError
from model_registry.types import Kind, MediaLimits

_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?|mps)$")
_ADAPTER_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_MAX_ADAPTERS = 64
_BUDGET = re.compile(r"^\s*(\d+(\.\d+)?)\s*(%|b|kb|mb|gb|kib|mib|gib|tib)?\s*$", re.IGNORECASE)
_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}

Pooling = Literal["cls", "mean", "max", "lasttoken", "weightedmean", "mean_sqrt_len_tokens"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CacheSpec(_Frozen):
    """A model's result cache (docs/caching.md): `bytes` of results in memory, least recently used
    dropped first; `disk`, a directory that keeps them across restarts, up to `disk_bytes`."""

    memory_bytes: str | int = Field(alias="bytes")
    disk: str | None = Field(default=None, min_length=1)
    disk_bytes: str | int = "1GiB"

    @field_validator("memory_bytes", "disk_bytes")
    @classmethod
    def _size(cls, value: str | int) -> str | int:
        if isinstance(value, str) and value.strip().endswith("%"):
            raise ValueError("expected a size like '256MiB' or '1GB', or bytes (a percentage has nothing to be of)")
        parse_budget(value, total=1)
        return value


class ModelSpec(_Frozen):
    """One served model. Only `name` and `source` are required; the rest is detected or defaulted."""

    name: str = Field(min_length=1, max_length=200)
    source: str = Field(min_length=1)
    kind: Kind | Literal["auto"] = "auto"
    #: The engine; `auto` takes the fastest one measured for the model's family, device and CPU
    #: kind that is installed, else torch (`backends.choice.fastest_table`; `/models` says which and why).
    backend: str = "auto"
    #: int8 on ONNX Runtime and CTranslate2; fp8 on torch, on a GPU of compute capability 8.9 and up.
    quantize: Literal["none", "int8", "fp8"] = "none"
    device: str = "auto"
    dtype: Literal["auto", "float32", "float16", "bfloat16", "int8_float16"] = "auto"
    pin: bool = False
    revision: str | None = None
    #: Tokens per batch, padding counted. "auto" times a few budgets at each load and keeps the
    #: best for throughput within `max_batch_seconds`; unset, the device's default (1,024 on a
    #: CPU, 16,384 on a GPU). `/models` shows the budget and how it was chosen.
    max_batch_tokens: Annotated[int, Field(ge=1, le=10_000_000)] | Literal["auto"] | None = None
    max_queued_items: int = Field(default=8192, ge=1)
    #: CUDA graphs of the torch engine's forward for small batches, captured at load: `auto` where
    #: the device is CUDA and the family is captured (`backends.graphs.FAMILIES`), `true` (or a
    #: start-up error saying why not), `false`.
    cuda_graphs: bool | Literal["auto"] = "auto"
    truncate: bool = True
    max_length: int | None = Field(default=None, ge=1)
    pooling: Pooling | None = None
    normalize: bool | None = None
    prompts: dict[str, str] | None = None
    default_prompt_name: str | None = None
    query_prompt_name: str | None = None
    trust_remote_code: bool = False
    keep_alive: float | None = Field(default=None, gt=0)
    options: dict[str, Any] = Field(default_factory=dict)
    #: LoRA adapters in PEFT's format (name -> directory) that a request names (`adapter`) to run
    #: this dense model with; batches never mix adapters. Torch only.
    adapters: dict[str, str] | None = None
    #: The base model of a `source` that is a PEFT LoRA adapter directory alone (nomic-embed-multimodal):
    #: its directory (a relative one inside the adapter's) or hub id (`org/name[@revision]`); unset,
    #: adapter_config.json's `base_model_name_or_path`, looked up as `source` is. The adapter is
    #: merged into it at load.
    base_model: str | None = Field(default=None, min_length=1)
    #: Off unless set: a cache of this model's results, keyed by its files and the inputs.
    cache: CacheSpec | None = None
    #: Models with more than one output (BGE-M3): the default weights of a hybrid rerank's parts.
    rerank_weights: dict[Literal["dense", "sparse", "multivector"], float] | None = None
    #: LLM rerankers (a causal LM with `kind: reranker`): the prompt, with {instruction}, {query} and
    #: {document} (or a built-in record's name); the tokens whose logits score a pair ("" as
    #: `false_token`: the true token's logit alone); the instruction when a request gives none.
    template: str | None = Field(default=None, min_length=1)
    true_token: str | None = Field(default=None, min_length=1)
    false_token: str | None = None
    instruction: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _catalogue(cls, data: Any) -> Any:
        """A known published `source` brings its catalogue record's keys; the entry's own win."""
        from model_registry.zoo.catalogue import with_record

        return with_record(data) if isinstance(data, Mapping) else data

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not _DEVICE.match(value):
            raise ValueError("expected auto, cpu, cuda, cuda:N or mps")
        return value

    @field_validator("template")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        from model_registry.zoo.rerank_templates import check_template

        if value is not None:
            check_template(value)
        return value

    def rerank_overrides(self) -> dict[str, str | None]:
        """The LLM reranker keys this entry sets (None where unset)."""
        return {
            "template": self.template,
            "true_token": self.true_token,
            "false_token": self.false_token,
            "instruction": self.instruction,
        }

    @model_validator(mode="after")
    def _rerank_keys(self) -> ModelSpec:
        given = sorted(key for key, value in self.rerank_overrides().items() if value is not None)
        if given and self.kind not in ("auto", Kind.RERANKER):
            raise ValueError(
                f"model '{self.name}': {', '.join(given)} apply to LLM rerankers (kind: reranker), "
                f"not to kind: {getattr(self.kind, 'value', self.kind)}"
            )
        return self

    @model_validator(mode="after")
    def _engine(self) -> ModelSpec:
        """Combinations no engine runs, told at start with what is supported."""
        from model_registry.backends.choice import check_static

        check_static(self.name, self.backend, self.quantize, self.dtype, self.device, self.kind)
        return self

    @model_validator(mode="after")
    def _graphs(self) -> ModelSpec:
        if self.cuda_graphs is not True:
            return self
        if not self.device.startswith(("cuda", "auto")):
            raise ValueError(
                f"model '{self.name}': cuda_graphs: true needs a CUDA device, not device: {self.device}; "
                "set device: cuda (or auto on a machine with a GPU), or cuda_graphs: auto"
            )
        if self.backend not in ("torch", "auto"):
            raise ValueError(
                f"model '{self.name}': cuda_graphs: true captures the torch engine, not backend: {self.backend}; "
                "set backend: torch, or cuda_graphs: auto"
            )
        return self

    @field_validator("adapters")
    @classmethod
    def _adapters(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return None
        if not value or len(value) > _MAX_ADAPTERS:
            raise ValueError(f"expected 1 to {_MAX_ADAPTERS} adapters, name -> directory")
        for name, path in value.items():
            if not _ADAPTER_NAME.match(name):
                raise ValueError(f"adapter name '{name}': use letters, digits, '.', '_' or '-' (at most 64)")
            if not path.strip():
                raise ValueError(f"adapter '{name}': an empty directory")
        return value

    @model_validator(mode="after")
    def _adapters_engine(self) -> ModelSpec:
        if self.adapters is None:
            return self
        if self.backend not in ("torch", "auto"):
            raise ValueError(
                f"model '{self.name}': adapters run on backend: torch, which applies each batch's adapter; "
                f"not backend: {self.backend}"
            )
        if self.quantize != "none":
            raise ValueError(f"model '{self.name}': adapters run on unquantized weights; set quantize: none")
        return self

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if value.strip() != value or "\n" in value:
            raise ValueError("a model name cannot start or end with white space")
        return value


class RegistryLimits(MediaLimits):
    """The limits that apply to every model: the registry's, and the server's `server:` keys of the
    same names (its settings embed these, declared here once)."""

    memory_budget: str | int = "90%"
    request_timeout: float = Field(default=120.0, gt=0)
    max_inputs_per_request: int = Field(default=2048, ge=1)
    max_input_chars: int = Field(default=100_000, ge=1)
    #: Clients may raise their priority above the default without the `priority` key scope.
    allow_client_priority: bool = False
    #: Pages a request's PDFs may hold together, counted before any is rendered (docs/multimodal.md).
    max_pdf_pages: int = Field(default=64, ge=1)

    @field_validator("memory_budget")
    @classmethod
    def _budget(cls, value: str | int) -> str | int:
        parse_budget(value, total=1)
        return value

    @property
    def media(self) -> MediaLimits:
        """The media limits alone, as each model's load takes them."""
        return MediaLimits(**{name: getattr(self, name) for name in MediaLimits.model_fields})


class RegistryConfig(RegistryLimits):
    """Everything the registry needs: the models and the limits that apply to all of them."""

    models: tuple[ModelSpec, ...] = ()
    load_timeout: float = Field(default=600.0, gt=0)
    failed_retry_after: float = Field(default=30.0, ge=0)
    room_wait: float = Field(default=2.0, ge=0)
    #: Items a request may become once `long_inputs: "chunk"` windows its long texts.
    max_chunks_per_request: int = Field(default=256, ge=1)
    prepare_threads: int = Field(default=2, ge=1, le=64)
    small_request_items: int = Field(default=8, ge=0)
    #: A request waiting this long without progress gets the next batch ahead of higher classes
    #: (at most one such batch per interval per model); see docs/reliability.md.
    aging_seconds: float = Field(default=1.0, gt=0)
    #: The longest a batch may take at the budget `max_batch_tokens: auto` chooses.
    max_batch_seconds: float = Field(default=0.5, gt=0)
    #: Share of the time before a deadline that admission may plan to fill at the measured rate.
    admission_headroom: float = Field(default=0.7, gt=0, le=1)
    #: Where converted engine artifacts (ONNX exports, CTranslate2 models) are cached; None is
    #: $INFINITY_ENGINE_CACHE or the user's cache directory.
    engine_cache: str | None = None

    @model_validator(mode="after")
    def _queues_hold_a_whole_request(self) -> RegistryConfig:
        limit = self.max_inputs_per_request
        for i, spec in enumerate(self.models):
            if spec.max_queued_items < limit:
                raise ValueError(
                    f"models.{i}.max_queued_items is {spec.max_queued_items}, below max_inputs_per_request ({limit}): "
                    f"requests with more inputs would be refused forever; set it to at least {limit}"
                )
        return self

    @model_validator(mode="after")
    def _unique_names(self) -> RegistryConfig:
        seen: set[str] = set()
        for spec in self.models:
            if spec.name in seen:
                raise ValueError(f"two models are named '{spec.name}'; names must be unique")
            seen.add(spec.name)
        return self


def parse_budget(value: str | int, *, total: int) -> int:
    """'90%' of `total`, '8GiB', '500MB' or a plain byte count -> bytes."""
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("a byte budget must be positive")
        return value
    match = _BUDGET.match(value)
    if not match:
        raise ValueError("expected a percentage like '90%', a size like '8GiB' or '500MB', or bytes")
    number, unit = float(match.group(1)), (match.group(3) or "b").lower()
    if unit == "%":
        if not 0 < number <= 100:
            raise ValueError("a percentage budget must be in (0, 100]")
        return int(total * number / 100)
    return int(number * _UNITS[unit])


def format_validation_error(error: ValidationError, *, prefix: str = "") -> str:
    """One line per problem: where, what was given, what is accepted."""
    lines = []
    for problem in error.errors():
        where = ".".join(str(part) for part in (prefix, *problem["loc"]) if part != "")
        given = problem.get("input")
        shown = repr(given) if not isinstance(given, Mapping) else "a mapping"
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            message = "unknown key"
        lines.append(f"{where or '(top level)'}: {message} (got {shown})")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def registry_config(data: Mapping[str, Any]) -> RegistryConfig:
    """Validate a mapping (the registry part of a configuration file) into a `RegistryConfig`."""
    try:
        return RegistryConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error)) from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A configuration file as a mapping; an unreadable or non-mapping file is a `ConfigError`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"cannot read the configuration file '{path}': {error.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"the configuration file '{path}' is not valid YAML: {error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"the configuration file '{path}' must be a mapping with 'models' and 'server' keys")
    return data


def load_config(path: str | Path) -> RegistryConfig:
    """The registry part of a YAML file: `models` plus the registry limits under `registry`."""
    data = read_yaml(path)
    unknown = set(data) - {"models", "server", "registry"}
    if unknown:
        raise ConfigError(
            f"invalid configuration: unknown top-level key(s) {sorted(unknown)}; accepted: models, server, registry"
        )
    merged = dict(data.get("registry") or {})
    merged["models"] = data.get("models") or []
    return registry_config(merged)
