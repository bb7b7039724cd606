"""A start imports what its configuration uses: a model on torch without fp8 loads and answers
without torchao (the fp8 extra's library, which transformers' model code would import wherever it
is installed, logging two warnings at every start)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders.text import tiny_bert

CODE = """
import asyncio, sys
from model_registry import Registry, RegistryConfig
from model_registry.config import ModelSpec

async def main():
    config = RegistryConfig(models=[ModelSpec(name="m", source=sys.argv[1], backend="torch")])
    async with Registry(config) as registry:
        await registry.embed("m", ["a sentence"])
    print("torchao imported:", "torchao" in sys.modules)

asyncio.run(main())
"""


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao (the fp8 extra) is not installed")
def test_a_model_without_fp8_never_imports_torchao(tmp_path: Path) -> None:
    model = tiny_bert(tmp_path / "bert")
    done = subprocess.run([sys.executable, "-c", CODE, str(model)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torchao imported: False" in done.stdout
    assert "_pytree" not in done.stderr
