"""The engine: many retrieval models by name, batched, usable without a server.

async with Registry.from_config("models.yaml") as registry:
    results = await registry.embed("all-MiniLM-L6-v2", ["a sentence"])
"""

from model_registry.config import ModelSpec, RegistryConfig, load_config, registry_config
from model_registry.errors import (
    BatchFailed,
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
from model_registry.registry import Registry
from model_registry.sync import SyncRegistry
from model_registry.types import Capability, Embedding, Kind, ModelInfo, ModelState, Output, Results

__all__ = [
    "BatchFailed",
    "Capability",
    "ConfigError",
    "DeadlineExceeded",
    "Embedding",
    "InputTooLong",
    "InsufficientMemory",
    "InvalidInput",
    "Kind",
    "ModelInfo",
    "ModelSpec",
    "ModelState",
    "ModelUnavailable",
    "Output",
    "Overloaded",
    "Registry",
    "RegistryConfig",
    "RegistryError",
    "Results",
    "SyncRegistry",
    "UnknownModel",
    "UnsupportedOperation",
    "load_config",
    "registry_config",
]
