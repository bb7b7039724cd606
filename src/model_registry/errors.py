"""Typed domain errors. The HTTP layer maps each class to a status in one table."""

from __future__ import annotations


class RegistryError(Exception):
    """Base of every error the engine raises on purpose. `param` names the offending field."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def __str__(self) -> str:
        return self.message


class ConfigError(RegistryError):
    """The configuration is invalid; raised once at start."""


class InvalidInput(RegistryError):
    """The request's content cannot be processed (empty, wrong shape, undecodable media)."""


class InputTooLong(InvalidInput):
    """An input exceeds the model's maximum length and truncation is off."""


class UnsupportedOperation(RegistryError):
    """The model exists but cannot do what was asked (e.g. embeddings from a reranker)."""


class UnknownModel(RegistryError):
    def __init__(self, name: str, known: list[str]) -> None:
        listed = ", ".join(sorted(known)) or "none"
        super().__init__(f"The model '{name}' does not exist. Models served: {listed}.", param="model")
        self.name = name


class Overloaded(RegistryError):
    """The model's queue is full; the client should retry after `retry_after` seconds."""

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ModelUnavailable(RegistryError):
    """The model cannot serve right now: it failed to load, does not fit, or is shutting down."""


class InsufficientMemory(ModelUnavailable):
    """The model does not fit in its device's budget now, even after evicting every idle model.

    Not a fault of the model: it is not marked failed, and the next request tries again."""


class DeadlineExceeded(RegistryError):
    """The request was not finished before its deadline; its pending work was dropped."""


class BatchFailed(RegistryError):
    """The model raised while processing a batch; every request in that batch gets this error."""


def not_finite(what: str) -> BatchFailed:
    """The error for an output that is NaN or infinity, never answered: `what` says whose, up to
    "NaN or infinity" ("the model's output for input 3 holds")."""
    return BatchFailed(
        f"{what} NaN or infinity (a model run in float16 can overflow: run it in bfloat16 or float32 with its `dtype`)"
    )


class Cancelled(RegistryError):
    """The request was cancelled by its caller (e.g. the client disconnected)."""
