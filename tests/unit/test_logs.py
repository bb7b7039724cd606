"""Every line the server logs is in its format, libraries' own included.

torch, transformers and huggingface_hub give their loggers a stderr handler of their own at import
(torch and transformers also stop them propagating), so their warnings would be bare text among
the JSON lines, and the hub's written twice. Each case runs in a fresh process: what matters is
the first import of each library, before or after logging is configured.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SCRIPT = """
import logging, sys, warnings

if sys.argv[1] == "before":
    import torch, transformers, huggingface_hub.utils.logging
from infinity_server.logs import configure_logging

configure_logging("info", "json")
import torch, transformers, huggingface_hub.utils.logging

logging.getLogger("torch._dynamo").warning("torch's own logger")
transformers.utils.logging.get_logger("transformers.modeling_utils").warning("transformers")
huggingface_hub.utils.logging.get_logger("huggingface_hub.file_download").warning("the hub")
warnings.warn("a warning")
"""


@pytest.mark.parametrize("imported", ["before", "after"])
def test_libraries_with_their_own_handlers_log_in_the_servers_format(imported: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, imported], capture_output=True, text=True, timeout=120, check=True
    )
    lines = [json.loads(line) for line in done.stderr.splitlines()]  # a bare line fails here
    said = [(line["logger"], line["message"]) for line in lines]
    assert said[:3] == [
        ("torch._dynamo", "torch's own logger"),
        ("transformers.modeling_utils", "transformers"),
        ("huggingface_hub.file_download", "the hub"),
    ]
    assert len(said) == 4
    assert said[3][0] == "py.warnings"
    assert "UserWarning: a warning" in said[3][1]
