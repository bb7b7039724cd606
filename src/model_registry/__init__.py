"""The engine: many retrieval models by name, batched, usable without a server.

async with Registry.from_config("models.yaml") as registry:
    results = await registry.embed("all-MiniLM-L6-v2", ["a sentence"])
"""

from model_registry.admission import OutputLimit
from model_registry.backends.choice import catalogue_listing
from model_registry.classify import Classification
from model_registry.config import ModelSpec, RegistryConfig, load_config, registry_config
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
from model_registry.handles import DeviceUsage, LifecycleEvent
from model_registry.long_inputs import Span, check_span_count, sentences
from model_registry.pages import Page, is_pdf
from model_registry.ranking import MAX_WEIGHT, Ranking
from model_registry.registry import Registry
from model_registry.similarity import normalized
from model_registry.sync import SyncRegistry
from model_registry.types import (
    Capability,
    Content,
    Embedding,
    Kind,
    Media,
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

__all__ = [
    "MAX_WEIGHT",
    "BatchFailed",
    "Cancelled",
    "Capability",
    "Classification",
    "ConfigError",
    "Content",
    "DeadlineExceeded",
    "DeviceUsage",
    "Embedding",
    "InputTooLong",
    "InsufficientMemory",
    "InvalidInput",
    "Kind",
    "LifecycleEvent",
    "Media",
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
    "Results",
    "Score",
    "Similarity",
    "Span",
    "SparseVector",
    "SyncRegistry",
    "Text",
    "Token",
    "UnknownModel",
    "UnsupportedOperation",
    "catalogue_listing",
    "check_span_count",
    "is_pdf",
    "load_config",
    "normalized",
    "registry_config",
    "sentences",
]
