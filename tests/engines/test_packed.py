"""Padding-free batches on the torch engine: every packed family and pooling against the padded
path on the same weights (fp32, 1e-4), batched against single, outputs that stay packed, the
budget that counts real tokens, the per-device choice as `/v1/models` shows it, and, on a CUDA
device, the varlen kernel in float16 against float32 padded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from model_registry.adapters import Adapter
from model_registry.backends.torch import packed
from model_registry.backends.torch.engine import TorchEngine
from model_registry.runtime.batching import BatchQueue, Request
from model_registry.types import EmbedItem, Item, Output, PairItem, Prepared, Text
from tests.builders.embedders import tiny_gemma3, tiny_modernbert, tiny_qwen3, tiny_xlmr
from tests.builders.jina import tiny_jina_v3, tiny_jina_v3_hf
from tests.builders.text import tiny_bert, tiny_qwen2
from tests.builders.zoo import tiny_bge_m3, tiny_colbert, tiny_llm_reranker, tiny_masked_lm
from tests.engines.helpers import TEXTS, arrays, load, max_difference, run

TOLERANCE = 1e-4
#: Long enough that the batch's tokens outnumber the models' positions (128): positions restart.
LONG = " ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * 4)
ALL_OUTPUTS = frozenset(Output)


def embeds(outputs: frozenset[Output] = frozenset({Output.DENSE}), query: bool = False, prompt: str = "") -> list[Item]:
    return [EmbedItem(Text(t), outputs=outputs, is_query=query, prompt=prompt) for t in [*TEXTS, LONG, "a b"]]


def tasks(task: str) -> list[Item]:
    """The texts for a model with task adapters (jina-embeddings-v3), under one task."""
    return [EmbedItem(Text(t), task=task) for t in [*TEXTS, LONG, "a b"]]


def late_chunks() -> list[Item]:
    """Whole texts and texts pooled per span (late chunking) in one batch."""
    spans = (((1, 3), (3, 9)), (), ((0, 1),), (), ((2, 40), (1, 2)), ())
    return [EmbedItem(Text(t), spans=s) for t, s in zip([*TEXTS, LONG, "a b"], spans, strict=True)]


def pooled_bert(pooling: str) -> Callable[[Path], Path]:
    return lambda root: tiny_bert(root, pooling=pooling, prompts={"query": "query: "}, include_prompt=False)


def pairs() -> list[Item]:
    return [PairItem(TEXTS[0], t) for t in [*TEXTS, LONG]]


#: family -> (builder, kind, items)
FAMILIES: dict[str, tuple[Callable[[Path], Path], str, Callable[[], list[Item]]]] = {
    "bert": (tiny_bert, "auto", embeds),
    "xlm-r": (tiny_xlmr, "auto", embeds),
    "modernbert": (tiny_modernbert, "auto", embeds),
    "qwen3-last-token-left-padded": (tiny_qwen3, "auto", embeds),
    "qwen2-last-token-left-padded": (tiny_qwen2, "auto", embeds),
    "qwen2-reranker": (tiny_llm_reranker, "reranker", pairs),
    "gemma3-bidirectional": (tiny_gemma3, "auto", embeds),
    "splade": (tiny_masked_lm, "sparse", lambda: embeds(frozenset({Output.SPARSE}))),
    "colbert": (tiny_colbert, "auto", lambda: embeds(frozenset({Output.MULTIVECTOR}))),
    # Query expansion: [MASK] tokens the attention does not see, each yielding a vector.
    "colbert-queries": (tiny_colbert, "auto", lambda: embeds(frozenset({Output.MULTIVECTOR}), query=True)),
    "bge-m3": (tiny_bge_m3, "auto", lambda: embeds(ALL_OUTPUTS)),
    "jina-v3-hf": (tiny_jina_v3_hf, "auto", embeds),
    "jina-v3-task-adapters": (tiny_jina_v3, "auto", lambda: tasks("retrieval.query")),
    "bert-late-chunks": (tiny_bert, "auto", late_chunks),
    # Every pooling mode, with the prompt's tokens left out of the pooling.
    **{
        f"bert-{mode}-prompt-excluded": (pooled_bert(mode), "auto", lambda: embeds(prompt="query: "))
        for mode in ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
    },
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("packed")
    return {family: build(root / family) for family, (build, _, _) in FAMILIES.items()}


@pytest.fixture
def packs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of sequences in each batch packed while the test runs."""
    seen: list[int] = []
    original = packed.pack

    def counting(mask: torch.Tensor, *args: Any, **kwargs: Any) -> packed.Packing:
        seen.append(int(mask.shape[0]))
        return original(mask, *args, **kwargs)

    monkeypatch.setattr(packed, "pack", counting)
    return seen


def engine_of(adapter: Adapter) -> TorchEngine:
    engine = getattr(adapter, "engine", None)
    assert isinstance(engine, TorchEngine)
    return engine


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_padding_free_equals_padded(family: str, models: dict[str, Path], tmp_path: Path, packs: list[int]) -> None:
    _, kind, make_items = FAMILIES[family]
    items = make_items()
    adapter = load(models[family], "torch", tmp_path, kind=kind)
    engine = engine_of(adapter)
    assert engine.describe()["attention"] == "padded"  # the CPU default
    padded = run(adapter, items)
    assert packs == []
    engine.use_padding_free("sdpa", "block-diagonal SDPA, as varlen computes it")
    together = run(adapter, items)
    assert packs == [len(items)]
    assert engine.describe()["attention"] == "padding_free"
    assert max_difference(padded, together) <= TOLERANCE
    alone = [run(adapter, [item])[0] for item in items]
    assert max_difference(together, alone) <= TOLERANCE


def test_the_block_mask_keeps_sequences_apart(
    models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the parity above rests on: without the mask, packed sequences see each other."""
    adapter = load(models["bert"], "torch", tmp_path)
    engine_of(adapter).use_padding_free("sdpa", "test")
    items = embeds()
    reference = run(adapter, items)
    everything = torch.ones(1, 1, 1, 1, dtype=torch.bool)
    monkeypatch.setattr(packed, "_block_mask", lambda packing, causal, window: everything)
    mixed = run(adapter, items)
    assert max_difference(reference, mixed) > 10 * TOLERANCE


def test_packing_of_a_left_and_right_padded_batch() -> None:
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [1, 0, 0]])
    packing = packed.pack(mask, "sdpa")
    assert packing.cu_seqlens.tolist() == [0, 2, 5, 6]
    assert packing.max_length == 3
    assert packed.positions(packing, 2).tolist() == [[2, 3, 2, 3, 4, 2]]
    assert packing.segments.tolist() == [0, 0, 1, 1, 1, 2]
    ids = torch.tensor([[0, 7, 8], [1, 2, 3], [9, 0, 0]])
    assert packed.flatten(ids, packing).tolist() == [[7, 8, 1, 2, 3, 9]]
    assert packed.last(packed.flatten(ids, packing)[0].unsqueeze(-1), packing.cu_seqlens).tolist() == [[8], [3], [9]]
    assert packing.keys is None


def test_packing_tokens_the_attention_does_not_see() -> None:
    """ColBERT's query expansion: the last tokens of a row are packed but are no keys."""
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    attended = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    packing = packed.pack(mask, "sdpa", attended=attended)
    assert packing.cu_seqlens.tolist() == [0, 4, 7]
    assert packing.keys is not None
    assert packing.cu_keys is not None
    assert packing.keys.tolist() == [True, True, False, False, True, True, True]
    assert (packing.cu_keys.tolist(), packing.max_keys) == ([0, 2, 5], 3)
    seen = packed._block_mask(packing, causal=False, window=None)[0, 0]
    assert seen[2].tolist() == [True, True, False, False, False, False, False]  # an expansion token
    assert seen[4].tolist() == [False, False, False, False, True, True, True]


def config(model_type: str, pad: int = 1) -> Any:
    return SimpleNamespace(model_type=model_type, pad_token_id=pad)


def test_positions_start_where_each_family_starts_them() -> None:
    assert packed.position_start(config("bert")) == 0
    assert packed.position_start(config("xlm-roberta", pad=1)) == 2
    assert packed.position_start(config("qwen3")) == 0
    assert packed.position_start(config("mpnet")) is None


@pytest.mark.parametrize(
    ("model_type", "device", "dtype", "task", "decoder", "reason"),
    [
        ("mpnet", "cuda", torch.float16, "feature-extraction", False, "model type 'mpnet' is not packed"),
        ("bert", "cuda", torch.float16, "sequence-classification", False, "classifier head pools inside"),
        ("bert", "cpu", torch.float32, "feature-extraction", False, "no variable-length attention kernel"),
        ("bert", "cuda", torch.float32, "feature-extraction", False, "float16 or bfloat16, not float32"),
    ],
)
def test_padded_where_a_family_device_or_dtype_cannot_pack(
    model_type: str, device: str, dtype: torch.dtype, task: str, decoder: bool, reason: str
) -> None:
    kernel, why = packed.choose(config(model_type), device, dtype, task, decoder)
    assert kernel is None
    assert reason in why


def test_a_decoder_reranker_and_cuda_half_pack() -> None:
    assert packed.choose(config("qwen2"), "cuda", torch.float16, "sequence-classification", True)[0] == "varlen"
    assert packed.choose(config("gemma3_text"), "cuda:0", torch.bfloat16, "feature-extraction", False)[0] == "varlen"


def test_models_shows_the_attention_path(serve: Any, models: dict[str, Path]) -> None:
    model = {"name": "bert", "source": str(models["bert"]), "device": "cpu", "backend": "torch"}
    server = serve({"models": [model]})
    with server.client() as client:
        assert client.post("/v1/embeddings", json={"model": "bert", "input": ["a"]}).status_code == 200
        listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    engine = listed["bert"]["details"]["engine"]
    assert (engine["attention"], engine["budget_counts"]) == ("padded", "padded_tokens")
    assert "no variable-length attention kernel" in engine["attention_reason"]
    assert (engine["precision"], listed["bert"]["dtype"]) == ("float32", "float32")


def cosines(left: list[Any], right: list[Any]) -> list[float]:
    found = []
    for a, b in zip(left, right, strict=True):
        for x, y in zip(arrays(a), arrays(b), strict=True):
            x, y = x.ravel(), y.ravel()
            found.append(float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y))))
    return found


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    "family",
    [
        "bert",
        "xlm-r",
        "modernbert",
        "qwen3-last-token-left-padded",
        "gemma3-bidirectional",
        "colbert",
        "colbert-queries",
        "bert-weightedmean-prompt-excluded",
        "jina-v3-task-adapters",
    ],
)
def test_varlen_in_half_precision_matches_padded_float32(family: str, models: dict[str, Path], tmp_path: Path) -> None:
    _, kind, make_items = FAMILIES[family]
    items = make_items()
    reference = run(load(models[family], "torch", tmp_path, kind=kind, device="cpu", dtype="float32"), items)
    adapter = load(models[family], "torch", tmp_path, kind=kind, device="cuda", dtype="float16")
    assert engine_of(adapter).describe()["attention"] == "padding_free"
    assert min(cosines(reference, run(adapter, items))) >= 0.999


@pytest.mark.parametrize(("family", "kind"), [("bert", "auto"), ("splade", "sparse")])
def test_per_token_outputs_stay_packed(family: str, kind: str, models: dict[str, Path], tmp_path: Path) -> None:
    """Hidden states and MLM logits come back for the real tokens alone, never padded."""
    adapter = load(models[family], "torch", tmp_path, kind=kind)
    engine = engine_of(adapter)
    engine.use_padding_free("sdpa", "test")
    batch = adapter.collate(adapter.prepare(embeds(frozenset({Output.SPARSE if kind == "sparse" else Output.DENSE}))))
    inputs = batch.inputs
    output = engine.run(inputs)
    real = int(inputs.attention_mask.sum())
    assert real < inputs.attention_mask.size  # the batch has padding to leave out
    assert output.packed is not None
    assert (output.hidden if output.logits is None else output.logits).shape[0] == real
    assert output.packed.cu_seqlens.tolist()[-1] == real


def test_a_decoder_reranker_scores_each_last_token_packed(models: dict[str, Path], tmp_path: Path) -> None:
    adapter = load(models["qwen2-reranker"], "torch", tmp_path, kind="reranker")
    engine = engine_of(adapter)
    engine.use_padding_free("sdpa", "test")
    items = pairs()
    output = engine.run(adapter.collate(adapter.prepare(items)).inputs)
    assert output.packed is None  # one row of logits per pair
    assert output.logits.shape[0] == len(items)


def batches_of(costs: list[int], batch_cost: Callable[[int, int, int], int]) -> list[list[int]]:
    """The batches a queue with a budget of 100 cuts one request of items of `costs` into."""
    queue = BatchQueue(max_batch_tokens=100, max_items=1000, batch_cost=batch_cost)
    queue.put(
        Request(
            [Prepared(i, c, c, None) for i, c in enumerate(costs)], priority=0, deadline=1e18, on_done=lambda _: None
        )
    )
    found = []
    while (batch := queue.next_batch(timeout=0)) is not None:
        found.append(sorted(e.prepared.cost for e in batch.entries))
    return found


def test_the_budget_counts_real_tokens_padding_free_and_padded_tokens_otherwise(
    models: dict[str, Path], tmp_path: Path
) -> None:
    adapter = load(models["bert"], "torch", tmp_path)
    assert adapter.describe()["engine"]["budget_counts"] == "padded_tokens"
    mixed, spread = [10, 10, 10, 10, 40], [2] * 15 + [40]
    # Padded: 4 x 10 = 40 fits, 5 x 40 = 200 does not.
    assert adapter.batch_cost(5, 40, 80) == 200
    assert batches_of(mixed, adapter.batch_cost) == [[10, 10, 10, 10], [40]]
    engine_of(adapter).use_padding_free("sdpa", "test")
    assert adapter.describe()["engine"]["budget_counts"] == "real_tokens"
    # Padding-free: the 80 real tokens fit in one batch.
    assert adapter.batch_cost(5, 40, 80) == 80
    assert batches_of(mixed, adapter.batch_cost) == [mixed]
    # 70 real tokens, but 16 rows of 40 lay out 640 positions on the host: a quarter, 160, is charged.
    assert adapter.batch_cost(16, 40, 70) == 160
    assert batches_of(spread, adapter.batch_cost) == [[2] * 15, [40]]
