"""The media engine code stays below the HTTP layer and keeps its heavy imports lazy."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import model_registry, model_registry.media.decoding, model_registry.adapters.towers
import model_registry.adapters.clip, model_registry.adapters.clap, model_registry.adapters.colpali
import model_registry.adapters.open_clip
bad = sorted(m for m in ("starlette", "httpx", "infinity_server", "PIL", "soundfile", "soxr", "open_clip")
             if m in sys.modules)
print(",".join(bad))
"""


def test_media_adapters_import_no_http_and_no_decoders_until_used() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == ""
