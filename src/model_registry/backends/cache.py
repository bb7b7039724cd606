"""The on-disk cache of converted engine artifacts (ONNX exports, CTranslate2 models).

An artifact lives in `<root>/<engine>/<key>/`, where the key hashes the model files' contents, the
versions of the libraries that produced it and the options it was built with; any change gives a
new artifact. Each artifact directory holds a `manifest.json` with the size and SHA-256 of every
file, written last: a directory without it, whose files do not match it, or that holds a file
it does not list, is corrupt or stale and is rebuilt, never loaded.

What the cache holds runs in the server, so it trusts only what the server's user alone can
write: the engine's directory and the root must belong to that user and be closed to group and
others, the directories above them must belong to the user or to root (writable by others only
with the sticky bit, as /tmp), and so must every entry of an artifact. Anything else is refused
with an `UnsafeCache` error that names the problem and the setting; the path goes to the log only,
since load errors reach clients.

Builds are safe across processes: a file lock per key serialises them, the artifact is built in a
staging directory beside its final place and moved there with one atomic rename, and a process
that waited on the lock finds the finished artifact and uses it. A staging directory exists only
while its build holds the key's lock, so one whose lock is free was left by a build that died (a
killed export) and is removed under that lock. A cache root that cannot be written falls back,
with a warning that names it and the setting, to a temporary directory for this process, so a
read-only volume never becomes a crash loop.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from model_registry.backends.build_process import BuildFailed
from model_registry.errors import ModelUnavailable, RegistryError

log = logging.getLogger(__name__)

ENV = "INFINITY_ENGINE_CACHE"
MANIFEST = "manifest.json"
#: Model files that change what an engine computes (weights, architecture, vocabulary size).
_MODEL_FILES = ("*.safetensors", "*.bin", "config.json", "onnx/*.onnx", "onnx/*.onnx_data")
#: What a client sees in place of the cache's location.
HIDDEN = "<engine cache>"
_FIX = f"set registry.engine_cache (or ${ENV}) to a directory that this server's user owns and no other user can write"
_fallback: Path | None = None


class UnsafeCache(ModelUnavailable):
    """The engine cache, or an artifact in it, could have been written by another user."""


def cache_root(configured: str | None) -> Path:
    """The configured directory, else $INFINITY_ENGINE_CACHE, else the user's cache directory."""
    if configured:
        return Path(configured).expanduser()
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "infinity-server" / "engines"


def make_dirs(path: Path) -> None:
    """`path` and its missing parents, each open to this user alone whatever the umask."""
    for directory in reversed([p for p in (path, *path.parents) if not p.is_dir()]):
        directory.mkdir(mode=0o700, exist_ok=True)


def writable_root(configured: str | None) -> Path:
    """`cache_root`, created if needed; a temporary directory when it cannot be written."""
    global _fallback
    root = cache_root(configured)
    try:
        make_dirs(root)
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


# ---- trust: who may have written what the cache holds -------------------------------------------


def _unsafe(path: Path, problem: str) -> UnsafeCache:
    log.error("refusing the engine cache: %s %s", path, problem)
    return UnsafeCache(f"the engine cache is not safe to load a converted model from: {problem}; {_FIX}")


def _flaw(status: os.stat_result, *, root_may_own: bool = False, sticky_ok: bool = False) -> str | None:
    """What lets another user change an entry with this status, or None."""
    if status.st_uid != os.geteuid() and not (root_may_own and status.st_uid == 0):
        return f"belongs to another user (uid {status.st_uid})"
    mode = stat.S_IMODE(status.st_mode)
    if mode & 0o022 and not (sticky_ok and mode & stat.S_ISVTX):
        return f"can be written by other users (mode {mode:o})"
    return None


def check_place(place: Path) -> None:
    """Raise `UnsafeCache` unless `place` (`<root>/<engine>`), its root and every directory above
    them can be changed by this server's user (or root) alone."""
    real = place.resolve()
    for depth, directory in enumerate((real, *real.parents)):
        within = depth < 2  # the engine's directory and the root
        flaw = _flaw(os.stat(directory), root_may_own=not within, sticky_ok=not within)
        if flaw is not None:
            where = "the cache directory" if within else "a directory above the cache"
            raise _unsafe(directory, f"{where} {flaw}")


def check_artifact(artifact: Path) -> None:
    """Raise `UnsafeCache` unless the artifact and every entry in it are this user's alone."""
    for entry in (artifact, *artifact.rglob("*")):
        status = entry.lstat()
        flaw = "is a link" if stat.S_ISLNK(status.st_mode) else _flaw(status)
        if flaw is not None:
            name = "directory" if entry == artifact else f"file {entry.relative_to(artifact)}"
            raise _unsafe(entry, f"the cached artifact's {name} {flaw}")


def redact(text: str, root: Path) -> str:
    """`text` with the cache's location replaced by `HIDDEN`, for messages that reach clients."""
    for form in sorted({str(root.resolve()), str(root)}, key=len, reverse=True):
        text = text.replace(form, HIDDEN)
    return text


def load_failed(engine: str, artifact: Path, error: Exception) -> ModelUnavailable:
    """The error for an artifact its engine would not load even after a rebuild; the path is logged."""
    log.error("the %s artifact %s failed to load after a rebuild: %s", engine, artifact, error)
    detail = redact(str(error), artifact.parent.parent)
    return ModelUnavailable(f"its {engine} artifact failed to load even after a rebuild: {detail}")


# ---- contents: the manifest ---------------------------------------------------------------------


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
    """The manifest is there, lists every file the artifact holds, and each has its recorded size
    and hash."""
    try:
        manifest = json.loads((artifact / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
        held = {str(p.relative_to(artifact)) for p in _files(artifact)}
        if held != set(files):
            log.warning("the cached artifact %s holds other files than its manifest lists; rebuilding it", artifact)
            return False
        for name, (size, digest) in files.items():
            path = artifact / name
            if path.stat().st_size != size or _sha256(path) != digest:
                log.warning("the cached artifact %s is corrupt (%s changed); rebuilding it", artifact, name)
                return False
        return bool(files)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _seal(directory: Path, meta: Mapping[str, Any]) -> None:
    """Write the manifest, then close every entry to other users (under a umask of 0 the build's
    files would be left writable by anyone, and refused at the next load)."""
    files = {str(p.relative_to(directory)): [p.stat().st_size, _sha256(p)] for p in _files(directory)}
    text = json.dumps({"files": files, "meta": dict(meta), "built": time.time()}, indent=1)
    (directory / MANIFEST).write_text(text, encoding="utf-8")
    for entry in directory.rglob("*"):
        mode = stat.S_IMODE(entry.lstat().st_mode)
        if mode & 0o022 and not entry.is_symlink():
            entry.chmod(mode & ~0o022)


# ---- building -----------------------------------------------------------------------------------


def _lock(place: Path, key: str, timeout: float = -1) -> FileLock:
    return FileLock(str(place / f"{key}.lock"), timeout=timeout)


def _staged_key(staging: Path) -> str:
    return staging.name[1:].rpartition("-")[0]  # `.<key>-<random>`; the random part has no '-'


def sweep(place: Path) -> None:
    """Remove the staging directories in `place` that no running build owns.

    A build holds its key's lock for as long as its staging directory (`.<key>-*`) exists, so a
    key whose lock is free now has only leftovers of builds that died; a key still locked is
    being built and is left alone."""
    staging = [p for p in place.glob(".*-*") if p.is_dir()]
    for key in sorted({_staged_key(p) for p in staging} - {""}):
        try:
            with _lock(place, key, timeout=0):
                for leftover in (p for p in staging if _staged_key(p) == key):
                    log.info("removing %s, left by a %s build that did not finish", leftover, place.name)
                    shutil.rmtree(leftover, ignore_errors=True)
        except Timeout:
            continue


def _ready(final: Path) -> bool:
    """Whether `final` is a complete artifact; `UnsafeCache` where another user could change it."""
    try:
        check_artifact(final)
    except FileNotFoundError:  # absent, or being replaced by a build in another process
        return False
    return is_complete(final)


def cached(
    root: Path, engine: str, key: str, build: Callable[[Path], None], *, meta: Mapping[str, Any] | None = None
) -> Path:
    """The artifact directory for `key`, built once by `build(directory)` if missing or corrupt.

    Raises `UnsafeCache` where another user could have written the cache or the artifact, and
    `ModelUnavailable` where the cache cannot be used or the build fails; no message holds a path
    of the cache."""
    place = root / engine
    final = place / key
    try:
        make_dirs(place)
        check_place(place)
        sweep(place)
        if _ready(final):
            return final
        lock = _lock(place, key)
        lock.acquire()
    except OSError as error:
        log.error("the engine cache %s cannot be used: %s", place, error)
        reason = error.strerror or type(error).__name__
        raise ModelUnavailable(f"the engine cache cannot be used ({reason}); {_FIX}") from None
    try:
        if not _ready(final):  # else another process built it while this one waited
            _build(place, key, build, meta or {})
    finally:
        lock.release()
    return final


def _build(place: Path, key: str, build: Callable[[Path], None], meta: Mapping[str, Any]) -> None:
    final = place / key
    staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=place))
    started = time.monotonic()
    try:
        build(staging)
        _seal(staging, meta)
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, RegistryError) or not isinstance(error, Exception):
            raise
        if isinstance(error, BuildFailed):  # its process logged the traceback; the message says how
            log.error("building the %s artifact %s failed: %s", place.name, final, error)
            detail = str(error)
        else:
            log.exception("building the %s artifact %s failed", place.name, final)
            detail = f"{type(error).__name__}: {error}"
        raise ModelUnavailable(f"building its {place.name} artifact failed: {redact(detail, place.parent)}") from error
    log.info("built %s artifact %s in %.1f s", place.name, final, time.monotonic() - started)


def invalidate(artifact: Path) -> None:
    """Mark an artifact that failed to load as corrupt, so the next `cached` rebuilds it."""
    (artifact / MANIFEST).unlink(missing_ok=True)
