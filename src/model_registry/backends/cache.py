"""The on-disk cache of converted engine artifacts (ONNX exports, CTranslate2 models).

An artifact lives in `<root>/<engine>/<key>/`, where the key hashes the model files' contents, the
versions of the libraries that produced it and the options it was built with; any change gives a
new artifact. Each artifact directory holds a `manifest.json` with the size and SHA-256 of every
file, written last: a directory without it, or whose files no longer match it, is corrupt or
stale and is rebuilt.

Builds are safe across processes: a file lock per key serialises them, the artifact is built in a
temporary directory beside its final place and moved there with one atomic rename, and a process
that waited on the lock finds the finished artifact and uses it. A cache root that cannot be
written falls back, with a warning that names it and the setting, to a temporary directory for
this process, so a read-only volume never becomes a crash loop.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from filelock import FileLock

log = logging.getLogger(__name__)

ENV = "INFINITY_ENGINE_CACHE"
MANIFEST = "manifest.json"
#: Model files that change what an engine computes (weights, architecture, vocabulary size).
_MODEL_FILES = ("*.safetensors", "*.bin", "config.json", "onnx/*.onnx", "onnx/*.onnx_data")
_fallback: Path | None = None


def cache_root(configured: str | None) -> Path:
    """The configured directory, else $INFINITY_ENGINE_CACHE, else the user's cache directory."""
    if configured:
        return Path(configured).expanduser()
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "infinity-server" / "engines"


def writable_root(configured: str | None) -> Path:
    """`cache_root`, created if needed; a temporary directory when it cannot be written."""
    global _fallback
    root = cache_root(configured)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=root, prefix=".probe-", delete=True)  # noqa: SIM115
        probe.close()
        return root
    except OSError as error:
        if _fallback is None:
            _fallback = Path(tempfile.mkdtemp(prefix="infinity-engines-"))
        log.warning(
            "the engine cache %s cannot be written (%s); converted models go to %s for this process "
            "only. Set registry.engine_cache or $%s to a writable directory to keep them across restarts",
            root,
            error.strerror or error,
            _fallback,
            ENV,
        )
        return _fallback


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def model_files(directory: Path) -> list[Path]:
    return sorted({p for pattern in _MODEL_FILES for p in directory.glob(pattern) if p.is_file()})


def artifact_key(directory: Path, versions: Mapping[str, str], options: Mapping[str, Any]) -> str:
    """Hash of the model files' contents, the library versions and the build options."""
    digest = hashlib.sha256()
    for path in model_files(directory):
        digest.update(str(path.relative_to(directory)).encode())
        digest.update(_sha256(path).encode())
    digest.update(json.dumps({"versions": dict(versions), "options": dict(options)}, sort_keys=True).encode())
    return digest.hexdigest()[:24]


def _files(directory: Path) -> Iterable[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)


def is_complete(artifact: Path) -> bool:
    """The manifest is there and every file it lists has its recorded size and hash."""
    try:
        manifest = json.loads((artifact / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
        for name, (size, digest) in files.items():
            path = artifact / name
            if path.stat().st_size != size or _sha256(path) != digest:
                log.warning("the cached artifact %s is corrupt (%s changed); rebuilding it", artifact, name)
                return False
        return bool(files)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _seal(directory: Path, meta: Mapping[str, Any]) -> None:
    files = {str(p.relative_to(directory)): [p.stat().st_size, _sha256(p)] for p in _files(directory)}
    text = json.dumps({"files": files, "meta": dict(meta), "built": time.time()}, indent=1)
    (directory / MANIFEST).write_text(text, encoding="utf-8")


def cached(
    root: Path, engine: str, key: str, build: Callable[[Path], None], *, meta: Mapping[str, Any] | None = None
) -> Path:
    """The artifact directory for `key`, built once by `build(directory)` if missing or corrupt."""
    place = root / engine
    place.mkdir(parents=True, exist_ok=True)
    final = place / key
    if is_complete(final):
        return final
    with FileLock(str(place / f"{key}.lock")):
        if is_complete(final):  # another process built it while this one waited
            return final
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=place))
        started = time.monotonic()
        try:
            build(staging)
            _seal(staging, meta or {})
            if final.exists():
                shutil.rmtree(final)
            os.replace(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        log.info("built %s artifact %s in %.1f s", engine, final, time.monotonic() - started)
    return final


def invalidate(artifact: Path) -> None:
    """Mark an artifact that failed to load as corrupt, so the next `cached` rebuilds it."""
    (artifact / MANIFEST).unlink(missing_ok=True)
