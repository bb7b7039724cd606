"""Shared setup of the multimodal integration tests: tiny models on disk and a server over them."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from infinity_server.app import create_app
from infinity_server.settings import ServerSettings, Settings
from model_registry.config import registry_config
from tests.builders.media import (
    tiny_clap,
    tiny_clip,
    tiny_colmodernvbert,
    tiny_colpali,
    tiny_colqwen2,
    tiny_open_clip,
    tiny_siglip,
)
from tests.conftest import LiveServer, start_server

MIME = {".jpg": "image/jpeg", ".png": "image/png", ".wav": "audio/wav", ".pdf": "application/pdf"}


def build_models(root: Path) -> dict[str, Path]:
    return {
        "clip": tiny_clip(root / "clip"),
        "siglip": tiny_siglip(root / "siglip"),
        "open-clip": tiny_open_clip(root / "open-clip"),
        "clap": tiny_clap(root / "clap"),
        "colpali": tiny_colpali(root / "colpali"),
        "colqwen2": tiny_colqwen2(root / "colqwen2"),
        "colqwen2.5": tiny_colqwen2(root / "colqwen2.5", backbone="qwen2_5_vl"),
        "colmodernvbert": tiny_colmodernvbert(root / "colmodernvbert"),
    }


@contextmanager
def media_server(
    models: dict[str, Path], registry: dict[str, Any] | None = None, **server: Any
) -> Iterator[LiveServer]:
    entries = [{"name": name, "source": str(path), "pin": True} for name, path in models.items()]
    settings = Settings(ServerSettings(**server), registry_config({"models": entries, **(registry or {})}))
    live = start_server(create_app(settings))
    try:
        yield live
    finally:
        live.close()


def data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
