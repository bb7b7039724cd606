"""The keys of the result cache: a model's identity (the settings that change its results and the
contents of its files, at any depth) and an item's key under it (every field of the item, each with
its type and length, so that no two items collide).

A file's digest is remembered by its path and status, so a reload reads no weights again.
"""

from __future__ import annotations

import array
import enum
import hashlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

from model_registry.adapters.base import Adapter
from model_registry.config import ModelSpec
from model_registry.errors import ModelUnavailable
from model_registry.families.peft_lora import adapter_directory
from model_registry.types import Item
from model_registry.zoo.sources import resolve_source

#: Model settings that change nothing a result holds (scheduling, memory, naming).
_OPERATIONAL = frozenset({"name", "pin", "keep_alive", "max_queued_items", "max_batch_tokens", "cache", "truncate"})
#: Fields of an item that do not change its result (where a media input was fetched from).
_NOT_RESULT = frozenset({("Media", "source")})
#: Files above this size that are not weights are keyed by name and size, not by contents.
_SMALL_FILE = 64 << 20
#: What the engines load weights from (ONNX external data included), hashed whatever their size.
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".onnx", ".onnx_data", ".data")
#: Contents digests of model files, by path and status, shared by every model of the process.
_digests: OrderedDict[tuple[str, int, int, int, int, int], bytes] = OrderedDict()
_digests_lock = threading.Lock()
_DIGESTS_HELD = 4096


def model_identity(spec: ModelSpec, adapter: Adapter) -> str:
    """Hash of the settings that change the model's results and of its files, at any depth: every
    weight file and every other file up to `_SMALL_FILE` by contents, a larger other one by name
    and size."""
    settings = spec.model_dump(mode="json", exclude=set(_OPERATIONAL))
    settings["engine"] = adapter.backend
    settings["loaded_dtype"] = str(spec.dtype if adapter.dtype is None else adapter.dtype)
    settings["loaded_device"] = adapter.device or spec.device
    try:
        directory = resolve_source(spec.source, revision=spec.revision)
    except ModelUnavailable:  # a model without files (the fake one): its settings are all it is
        return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
    del settings["source"], settings["revision"]  # the files say what the model is, wherever they are
    adapters = settings.pop("adapters") or {}
    settings["adapters"] = sorted(adapters)  # each adapter by its name and its files
    base = _base_of(spec, directory)
    if base is not None:  # a PEFT adapter alone: its base model's files, wherever they are
        del settings["base_model"]
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    _digest_files(digest, directory)
    if base is not None:
        digest.update(b"base model:")
        _digest_files(digest, base)
    for name in sorted(adapters):
        digest.update(f"adapter {len(name)}:{name}:".encode())
        _digest_files(digest, adapter_directory(directory, adapters[name]))
    return digest.hexdigest()


def _base_of(spec: ModelSpec, directory: Path) -> Path | None:
    """The base model's directory of a PEFT adapter directory alone (None: the model is whole, or
    its base is not here yet, which its `base_model` setting then stands for)."""
    from model_registry.detection.peft_base import base_directory

    if not (directory / "adapter_config.json").is_file() or (directory / "config.json").is_file():
        return None
    try:
        return base_directory(directory, spec, download=False)
    except ModelUnavailable:
        return None


def _digest_files(digest: Any, directory: Path) -> None:
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        relative = path.relative_to(directory)
        if relative.parts[0].startswith("."):
            continue
        status = path.stat()
        name = relative.as_posix()
        digest.update(f"{len(name)}:{name}{status.st_size}:".encode())
        if status.st_size <= _SMALL_FILE or path.name.endswith(_WEIGHTS):
            digest.update(_file_digest(path, status))


def _file_digest(path: Path, status: os.stat_result) -> bytes:
    """SHA-256 of the file's contents, remembered while its inode, size, mtime and ctime stay the
    same: a reload reads no weights again, and a file rewritten in place (ctime) is read anew."""
    stamp = _stamp(path, status)
    with _digests_lock:
        if (known := _digests.get(stamp)) is not None:
            _digests.move_to_end(stamp)
            return known
    digest = _read_digest(path)
    if _stamp(path, path.stat()) == stamp:  # else it changed while read: not worth remembering
        with _digests_lock:
            _digests[stamp] = digest
            while len(_digests) > _DIGESTS_HELD:
                _digests.popitem(last=False)
    return digest


def _stamp(path: Path, status: os.stat_result) -> tuple[str, int, int, int, int, int]:
    return str(path), status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns


def _read_digest(path: Path) -> bytes:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.digest()


def item_key(identity: str, item: Item) -> str:
    digest = hashlib.sha256(identity.encode())
    _feed(digest, item)
    return digest.hexdigest()


def _feed(digest: Any, value: object) -> None:
    """Every field of `value`, each with its type and length, so that no two items collide."""
    if is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        digest.update(f"<{name}>".encode())
        for field in fields(value):
            if (name, field.name) not in _NOT_RESULT:
                _feed(digest, getattr(value, field.name))
    elif isinstance(value, bytes | str):
        data = value.encode() if isinstance(value, str) else value
        digest.update(f"{type(value).__name__}{len(data)}:".encode())
        digest.update(data)
    elif isinstance(value, frozenset | set):
        digest.update(f"set{len(value)}:".encode())
        for member in sorted(value, key=repr):
            _feed(digest, member)
    elif isinstance(value, tuple | list) and (block := _integers(value)) is not None:
        digest.update(f"int64{'x'.join(map(str, block.shape))}:".encode())  # the shape fixes the length
        digest.update(block)  # its little-endian int64 bytes, read in place
    elif isinstance(value, tuple | list):
        digest.update(f"seq{len(value)}:".encode())
        for member in value:
            _feed(digest, member)
    elif value is None or isinstance(value, bool | int | float | enum.Enum):
        digest.update(f"{value!r};".encode())
    else:
        raise TypeError(f"This is a bug: an item holds a {type(value).__name__}, which the cache cannot key")


def _integers(value: Sequence[Any]) -> np.ndarray | None:
    """`value` as one little-endian int64 array when it holds integers only (token ids) or
    equal-length sequences of them (spans), else None: one C loop, not a Python call per id."""
    if not value:
        return None
    try:
        if isinstance(value[0], tuple | list):
            block = np.asarray(value)
            if block.ndim != 2 or block.dtype.kind != "i":
                return None
        else:
            block = np.frombuffer(array.array("q", value), dtype=np.int64)  # anything but an integer raises
    except (TypeError, ValueError, OverflowError):
        return None
    return block.astype("<i8", copy=False)
