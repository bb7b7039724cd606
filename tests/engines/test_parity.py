"""Every family on every engine that serves it equals the torch engine on the same weights.

Tiny random models (tests/builders) are built once per module; each engine converts them once
into a module-wide cache. fp32 parity is 1e-4 in max absolute difference; a batch equals its
items run one by one on every engine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engines.families import FAMILIES
from tests.engines.helpers import load, max_difference, run

pytest.importorskip("onnxruntime")
pytest.importorskip("ctranslate2")

TOLERANCE = 1e-4
CELLS = [(family, engine) for family, spec in FAMILIES.items() for engine in spec[3]]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {family: spec[0](root / family) for family, spec in FAMILIES.items()}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine-cache")


@pytest.mark.parametrize(("family", "engine"), CELLS)
def test_engine_matches_torch_and_batched_equals_single(
    models: dict[str, Path], cache: Path, family: str, engine: str
) -> None:
    _, kind, items, _ = FAMILIES[family]
    reference = run(load(models[family], "torch", cache, kind=kind), items())
    adapter = load(models[family], engine, cache, kind=kind)
    assert adapter.backend == engine
    batched = run(adapter, items())
    assert max_difference(batched, reference) <= TOLERANCE, f"{family} on {engine} differs from torch"
    single = [run(adapter, [item])[0] for item in items()]
    assert max_difference(single, batched) <= TOLERANCE, f"{family} on {engine}: batched differs from single"
    adapter.unload()
