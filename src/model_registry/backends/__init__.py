"""Backend engines: torch, ONNX Runtime, CTranslate2, one module each behind `base.Engine`.

Importing this package imports no engine; `create_engine` imports the one asked for, so that a
server without the `onnx` or `ctranslate2` extra still starts its torch models.
"""

from __future__ import annotations

import importlib

from model_registry.backends.base import Engine
from model_registry.errors import ModelUnavailable

_ENGINES = {
    "torch": ("model_registry.backends.torch", "TorchEngine", "torch"),
    "onnx": ("model_registry.backends.onnx", "OnnxEngine", "onnx"),
    "ctranslate2": ("model_registry.backends.ctranslate2", "Ct2Engine", "ctranslate2"),
}


def create_engine(backend: str) -> Engine:
    """A fresh, unloaded engine; a missing extra is a `ModelUnavailable` naming the install command."""
    module, cls, extra = _ENGINES[backend]
    try:
        engine: Engine = getattr(importlib.import_module(module), cls)()
    except ImportError as error:
        raise ModelUnavailable(
            f"backend '{backend}' needs {error.name}, which is not installed; pip install 'infinity-server[{extra}]'"
        ) from error
    return engine
