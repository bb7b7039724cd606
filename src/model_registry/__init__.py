"""The engine: many retrieval models by name, batched, usable without a server.

async with Registry.from_config("models.yaml") as registry:
    results = await registry.embed("all-MiniLM-L6-v2", ["a sentence"])

This package, with `config`, `types` and `errors`, is the engine's public face: the server
imports nothing else of it. The observers a server hangs on a request (stage times, result cache
lookups, the arrival its deadline counts from) are here too.
"""

from model_registry.backends.choice import catalogue_listing
from model_registry.cache.results import Lookup as CacheLookup
from model_registry.cache.results import outcome as cache_outcome
from model_registry.cache.results import recording as record_cache_lookups
from model_registry.config import ModelSpec, RegistryConfig, load_config, registry_config
from model_registry.detection.peft_base import fetch_base
from model_registry.errors import (
    BatchFailed,
    Cancelled,
    ConfigError,
    DeadlineExceeded,
    InputTooLong,
    InsufficientMemory,
    InvalidInput,
    ModelUnavailable,
    Overloaded,
    RegistryError,
    UnknownModel,
    UnsupportedOperation,
)
from model_registry.media.pages import Page, is_pdf
from model_registry.media.similarity import normalized
from model_registry.registry import Registry
from model_registry.runtime.admission import OutputLimit
from model_registry.runtime.admission import arrival as request_arrival
from model_registry.runtime.handles import DeviceUsage, EventKind, LifecycleEvent
from model_registry.runtime.timing import StageTimes
from model_registry.runtime.timing import recording as record_stages
from model_registry.runtime.worker import BatchStats
from model_registry.sync import SyncRegistry
from model_registry.tasks.classify import Classification
from model_registry.tasks.embedding import EmbedCall
from model_registry.tasks.long_inputs import Span, check_span_count, sentences
from model_registry.tasks.rerank import MAX_WEIGHT, Ranking, RerankCall
from model_registry.types import (
    Capability,
    Content,
    Embedding,
    Kind,
    Media,
    Mixed,
    Modality,
    ModelInfo,
    ModelState,
    Output,
    Results,
    Score,
    Similarity,
    SparseVector,
    Text,
    Token,
)
from model_registry.zoo.catalogue import match as catalogue_match
from model_registry.zoo.sources import find_in_cache, resolve_source

__all__ = [
    "MAX_WEIGHT",
    "BatchFailed",
    "BatchStats",
    "CacheLookup",
    "Cancelled",
    "Capability",
    "Classification",
    "ConfigError",
    "Content",
    "DeadlineExceeded",
    "DeviceUsage",
    "EmbedCall",
    "Embedding",
    "EventKind",
    "InputTooLong",
    "InsufficientMemory",
    "InvalidInput",
    "Kind",
    "LifecycleEvent",
    "Media",
    "Mixed",
    "Modality",
    "ModelInfo",
    "ModelSpec",
    "ModelState",
    "ModelUnavailable",
    "Output",
    "OutputLimit",
    "Overloaded",
    "Page",
    "Ranking",
    "Registry",
    "RegistryConfig",
    "RegistryError",
    "RerankCall",
    "Results",
    "Score",
    "Similarity",
    "Span",
    "SparseVector",
    "StageTimes",
    "SyncRegistry",
    "Text",
    "Token",
    "UnknownModel",
    "UnsupportedOperation",
    "cache_outcome",
    "catalogue_listing",
    "catalogue_match",
    "check_span_count",
    "fetch_base",
    "find_in_cache",
    "is_pdf",
    "load_config",
    "normalized",
    "record_cache_lookups",
    "record_stages",
    "registry_config",
    "request_arrival",
    "resolve_source",
    "sentences",
]
