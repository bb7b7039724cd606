"""Logging: one JSON object per line (or plain text), each carrying the request id in scope.

The request id of the request being served lives in a context variable, so every line logged
while serving it (the access line, an error from the edge) names it without passing it around.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys
import time
from collections.abc import Sequence
from contextvars import ContextVar
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any, Literal

import orjson

REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)

#: Attributes every LogRecord has; anything else given through `extra=` is written as a field.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class RequestIdFilter(logging.Filter):
    """Stamps `record.request_id` from the context when the line is emitted (in its own thread)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = REQUEST_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """`{"time", "level", "logger", "message", "request_id", ...extra fields, "exception"}`."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            entry["request_id"] = request_id
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD and k != "request_id"})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure_logging(level: str, fmt: Literal["json", "text"]) -> None:
    """Root logging to stderr in the chosen format (the server's `log_format`)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.captureWarnings(True)  # `warnings.warn` lines too, as "py.warnings"
    waiting = {module: package for module, package in OWN_HANDLERS.items() if module not in sys.modules}
    for module, package in OWN_HANDLERS.items():
        if module in sys.modules:
            adopt(package)
    if waiting and not any(isinstance(finder, _AdoptOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AdoptOnImport(waiting))


#: Libraries that give their loggers a stderr handler of their own (torch and transformers also
#: stop them propagating), whose lines would bypass the format chosen here: the module whose import
#: installs the handler, and the library's name.
OWN_HANDLERS = {"torch": "torch", "transformers": "transformers", "huggingface_hub.utils.logging": "huggingface_hub"}


def adopt(package: str) -> None:
    """Send `package`'s loggers through the root's handler: their own handlers removed (a file one,
    such as torch's `TORCH_LOGS_OUT`, kept) and propagation on."""
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if not isinstance(logger, logging.Logger) or name.split(".")[0] != package:
            continue
        if name.endswith("__trace"):  # torch's structured trace (TORCH_TRACE): its own files, never stderr
            continue
        logger.handlers[:] = [h for h in logger.handlers if isinstance(h, logging.FileHandler)]
        logger.propagate = True


class _AdoptOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: on the first import of a module in `OWN_HANDLERS` (by a model's load,
    after logging is configured), has the usual finders find it and adopts its library's loggers
    once its import has run."""

    def __init__(self, waiting: dict[str, str]) -> None:
        self.waiting = dict(waiting)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        package = self.waiting.pop(fullname, None)  # popped: the lookup below skips this finder
        if package is None:
            return None
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenAdopt(spec.loader, package)
        return spec


class _ThenAdopt(importlib.abc.Loader):
    """A package's loader that adopts its loggers after running it, then steps aside."""

    def __init__(self, loader: importlib.abc.Loader, package: str) -> None:
        self.loader, self.package = loader, package

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        module.__loader__ = self.loader
        self.loader.exec_module(module)
        adopt(self.package)
