"""infinity-server: the HTTP edge over model_registry."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("infinity-server")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"
