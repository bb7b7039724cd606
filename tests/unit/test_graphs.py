"""CUDA graphs' buckets, padding and refusals, without a GPU: which bucket a batch takes, how it is
padded up to it and cut back, and which models and settings are captured."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Literal

import numpy as np
import pytest
import torch

from model_registry.backends.base import EncoderBatch, EncoderOutput, EngineOptions
from model_registry.backends.torch import graphs
from model_registry.backends.torch.graphs import Bucket
from model_registry.config import registry_config
from model_registry.errors import ConfigError, ModelUnavailable


def test_buckets_cover_a_few_batch_sizes_and_lengths_up_to_the_models_positions() -> None:
    assert len(graphs.buckets(512)) == 16
    assert {b.length for b in graphs.buckets(512)} == {16, 32, 64, 128}
    assert {b.rows for b in graphs.buckets(512)} == {1, 2, 4, 8}
    # a model with 40 positions: 16, 32, then 40 in place of 64 and 128
    assert {b.length for b in graphs.buckets(40)} == {16, 32, 40}
    assert graphs.buckets(512)[0] == Bucket(1, 16)
    assert graphs.buckets(512)[-1] == Bucket(8, 128)


@pytest.mark.parametrize(
    ("rows", "length", "bucket"),
    [
        (1, 1, Bucket(1, 16)),
        (1, 16, Bucket(1, 16)),
        (1, 17, Bucket(1, 32)),
        (3, 10, Bucket(4, 16)),
        (2, 40, Bucket(2, 64)),
        (5, 100, Bucket(8, 128)),
        (8, 128, Bucket(8, 128)),
        (4, 20, Bucket(4, 32)),
    ],
)
def test_a_batch_takes_the_smallest_bucket_that_holds_it(rows: int, length: int, bucket: Bucket) -> None:
    assert graphs.fit(graphs.buckets(512), rows, length) == bucket


@pytest.mark.parametrize(("rows", "length"), [(9, 4), (1, 129), (8, 200)])
def test_a_batch_larger_than_every_bucket_has_none(rows: int, length: int) -> None:
    assert graphs.fit(graphs.buckets(512), rows, length) is None


def test_padding_up_to_a_bucket_adds_masked_columns_and_rows_of_one_real_token() -> None:
    batch = EncoderBatch(
        input_ids=np.array([[5, 6, 7], [0, 8, 9]]),  # the second row left padded
        attention_mask=np.array([[1, 1, 1], [0, 1, 1]]),
        token_type_ids=np.array([[0, 1, 1], [0, 0, 1]]),
    )
    planes = graphs.padded(batch, Bucket(4, 5), pad_id=3, types=True)
    assert planes.dtype == np.int64
    assert planes[0].tolist() == [[5, 6, 7, 3, 3], [0, 8, 9, 3, 3], [3, 3, 3, 3, 3], [3, 3, 3, 3, 3]]
    assert planes[1].tolist() == [[1, 1, 1, 0, 0], [0, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 0, 0, 0, 0]]
    assert planes[2].tolist() == [[0, 1, 1, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]]
    assert graphs.padded(batch, Bucket(2, 3), pad_id=0, types=False).shape == (2, 2, 3)


def test_outputs_are_cut_back_to_the_batch_and_copied() -> None:
    hidden = torch.arange(4 * 5 * 2, dtype=torch.float32).reshape(4, 5, 2)
    logits = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    cut = graphs.sliced(EncoderOutput(hidden=hidden, logits=logits), rows=2, length=3)
    assert cut.hidden.tolist() == [[[0, 1], [2, 3], [4, 5]], [[10, 11], [12, 13], [14, 15]]]
    assert cut.logits.tolist() == [[1.0], [2.0]]
    hidden.zero_()  # the next replay overwrites the bucket's outputs: the batch's are its own
    assert cut.hidden[1, 2].tolist() == [14, 15]
    whole = graphs.sliced(EncoderOutput(hidden=hidden), rows=4, length=5)
    assert whole.hidden.data_ptr() != hidden.data_ptr()


def config(model_type: str = "bert", **extra: Any) -> Any:
    return SimpleNamespace(model_type=model_type, pad_token_id=0, max_position_embeddings=512, **extra)


def options(setting: bool | Literal["auto"] = "auto", **given: Any) -> EngineOptions:
    return EngineOptions(cuda_graphs=setting, **given)


@pytest.mark.parametrize(
    ("device", "model", "given", "reason"),
    [
        ("cpu", config(), options(), "this model runs on cpu"),
        ("cpu", config(), options(True), "this model runs on cpu"),
        ("cuda", config("modernbert"), options(), "model type 'modernbert' is not captured"),
        ("cuda", config("modernbert"), options(True), "model type 'modernbert' is not captured"),
        ("cuda", config(auto_map={"AutoModel": "x.Y"}), options(True, trust_remote_code=True), "code of its own"),
        ("cuda", config(vocab_size=30522), options(task="masked-lm"), "30522 vocabulary logits per token"),
        ("cuda", config(), options(quantize="fp8"), "quantize: fp8 is not checked under capture"),
    ],
)
def test_models_that_are_not_captured_say_why(device: str, model: Any, given: EngineOptions, reason: str) -> None:
    why = graphs.unfit(device, model, given)
    assert why is not None
    assert reason in why


@pytest.mark.parametrize(
    ("model", "given"),
    [
        (config("bert"), options()),
        (config("roberta"), options(task="sequence-classification")),
        (config("xlm-roberta"), options()),
        (config("qwen3"), options()),
        (config("qwen2"), options(task="causal-lm")),
        (config("bert", vocab_size=30522), options(True, task="masked-lm")),
        (config("bert"), options(True, quantize="fp8")),
        (config("bert"), options(trust_remote_code=True)),  # no code of its own: transformers' BERT
    ],
)
def test_the_captured_families_and_tasks_on_cuda(model: Any, given: EngineOptions) -> None:
    assert graphs.unfit("cuda:0", model, given) is None


def test_true_where_graphs_cannot_run_is_refused_naming_the_setting_and_the_device() -> None:
    def never(ids: torch.Tensor, mask: torch.Tensor, extra: dict[str, torch.Tensor]) -> EncoderOutput:
        raise AssertionError("nothing is captured")

    with pytest.raises(ModelUnavailable, match=r"cuda_graphs: true cannot be honoured: .*runs on cpu"):
        graphs.load(options(True), never, config(), "cpu")
    assert graphs.load(options(), never, config(), "cpu") == (
        None,
        "CUDA graphs replay on a CUDA device; this model runs on cpu",
    )
    assert graphs.load(options(False), never, config(), "cuda") == (None, "cuda_graphs: false")


def test_the_buckets_of_a_model_follow_its_positions_padding_and_token_types() -> None:
    assert graphs.layout(config()) == (512, 0, False)
    xlmr = SimpleNamespace(model_type="xlm-roberta", pad_token_id=1, max_position_embeddings=514, type_vocab_size=1)
    assert graphs.layout(xlmr) == (512, 1, True)  # RoBERTa's positions start after its padding id
    assert graphs.layout(SimpleNamespace(model_type="qwen3", pad_token_id=None)) == (128, 0, False)


@pytest.mark.parametrize(
    ("entry", "phrase"),
    [
        ({"device": "cpu"}, "cuda_graphs: true needs a CUDA device, not device: cpu"),
        ({"device": "cuda", "backend": "onnx"}, "cuda_graphs: true captures the torch engine, not backend: onnx"),
    ],
)
def test_the_configuration_refuses_true_where_it_cannot_hold(entry: dict[str, str], phrase: str) -> None:
    model = {"name": "m", "source": "/nowhere", "cuda_graphs": True, **entry}
    with pytest.raises(ConfigError, match=phrase):
        registry_config({"models": [model]})


@pytest.mark.parametrize(("value", "parsed"), [("auto", "auto"), (True, True), (False, False), ("false", False)])
def test_the_key_takes_auto_true_and_false(value: Any, parsed: Any) -> None:
    model = {"name": "m", "source": "/nowhere", "cuda_graphs": value}
    assert registry_config({"models": [model]}).models[0].cuda_graphs == parsed


def test_the_key_refuses_other_values() -> None:
    with pytest.raises(ConfigError, match="cuda_graphs"):
        registry_config({"models": [{"name": "m", "source": "/nowhere", "cuda_graphs": "sometimes"}]})


def test_a_load_is_charged_the_graph_pools_free_memory() -> None:
    """The private pool's blocks between replays hold no tensor, yet no other model can use them."""
    from model_registry.runtime.memory import CudaReading, cuda_footprint

    before = CudaReading(allocated=100, reserved=200, used=300, pooled=0)
    after = CudaReading(allocated=150, reserved=260, used=360, pooled=40)
    # peak 170 over 100 allocated before: 70; the reserve grew as much as the device used: 0 outside
    assert cuda_footprint(before, after, torch_peak=170) == 70 + 40
    assert cuda_footprint(before, CudaReading(150, 260, 360), torch_peak=170) == 70
