"""jina-embeddings-v3 in its published layout: transformers' port with the task adapters per request,
on torch and on ONNX Runtime.

The checkpoint names jinaai/xlm-roberta-flash-implementation's code (`XLMRobertaLoRA`) and keeps
its LoRA task adapters as parametrizations of every linear and embedding layer. The server runs
transformers' `JinaEmbeddingsV3Model` with the request's task adapter, without the hub code. The
reference is the port as the builder made it with that task's LoRA merged into its weights by
the published formula (`tests.builders.jina.merged_model`), the task's instruction before the
text, mean pooled and normalised as the sentence-transformers modules say.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.builders.jina import INSTRUCTIONS, TASKS, merged_model, reference_model, tiny_jina_v3, tiny_jina_v3_hf
from tests.builders.text import tiny_bert

pytestmark = pytest.mark.integration

SENTENCES = ["a cat sleeps on the mat", "the stock market fell sharply today", "two dogs"]


def reference(directory: Path, task: str | None, prefix: str | None = None) -> np.ndarray:
    """Each sentence alone through the port with `task`'s adapter merged (None: the base weights)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    size, pad = len(tokenizer), int(tokenizer.pad_token_id)
    model = reference_model(size, pad) if task is None else merged_model(size, pad, TASKS.index(task))
    prompt = prefix if prefix is not None else INSTRUCTIONS[task] if task else ""
    rows = []
    with torch.inference_mode():
        for sentence in SENTENCES:
            mean = model(**tokenizer(prompt + sentence, return_tensors="pt")).last_hidden_state[0].mean(dim=0)
            rows.append((mean / mean.norm()).numpy())
    return np.stack(rows)


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_jina_v3(tmp_path_factory.mktemp("jina") / "jina-embeddings-v3")


@pytest.fixture
def engine_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("INFINITY_ENGINE_CACHE", str(tmp_path / "engines"))
    return tmp_path / "engines"


def entry(directory: Path, **extra: Any) -> dict[str, Any]:
    return {"name": "jina", "source": str(directory), "backend": "torch", **extra}


def vectors(answer: Any) -> np.ndarray:
    assert answer.status_code == 200, answer.text
    return np.asarray([row["embedding"] for row in answer.json()["data"]])


def embed(client: Any, inputs: list[str], **options: Any) -> np.ndarray:
    return vectors(client.post("/v1/embeddings", json={"model": "jina", "input": inputs, **options}))


def test_detection_lays_out_the_port_s_view_without_reading_the_weights(published: Path, engine_cache: Path) -> None:
    """Listing models detects them on the event loop: the weights are split at the first load only."""
    from model_registry.config import ModelSpec
    from model_registry.detection.layout import detect

    layout = detect(published, ModelSpec(name="jina", source=str(published)))
    assert layout.family == "jina_lora"
    assert not layout.remote_code
    assert layout.config["model_type"] == "jina_embeddings_v3"
    assert layout.config["rope_parameters"]["rope_theta"] == 20000.0
    assert (layout.transformer_dir / "tokenizer.json").is_file()
    assert not (layout.transformer_dir / "model.safetensors").exists()


@pytest.mark.slow
def test_each_task_answers_as_its_adapter_merged_into_the_weights(
    serve: Any, published: Path, engine_cache: Path
) -> None:
    """No trust_remote_code: the port runs it; batched equals single; /v1/encode takes the task too."""
    live = serve({"models": [entry(published)]})
    with live.client() as client:
        for task in TASKS:
            batched = embed(client, SENTENCES, task=task)
            np.testing.assert_allclose(batched, reference(published, task), atol=1e-4)
            single = [embed(client, [s], task=task)[0] for s in SENTENCES]
            np.testing.assert_allclose(single, batched, atol=1e-5)
        body = {"model": "jina", "input": SENTENCES, "task": "retrieval.passage"}
        encoded = client.post("/v1/encode", json=body)
        assert encoded.status_code == 200, encoded.text
        dense = np.asarray([row["dense"] for row in encoded.json()["data"]])
        details = {m["id"]: m for m in client.get("/v1/models").json()["data"]}["jina"]["details"]
    np.testing.assert_allclose(dense, reference(published, "retrieval.passage"), atol=1e-4)
    assert details["task_adapters"]["tasks"] == list(TASKS)
    assert "native jina_embeddings_v3 port" in details["code"]


def test_requests_of_different_tasks_at_once_each_get_their_own(
    serve: Any, published: Path, engine_cache: Path
) -> None:
    each_task_at_once_gets_its_own(
        serve({"models": [entry(published)]}), published, ["retrieval.query", "classification"]
    )


def each_task_at_once_gets_its_own(live: Any, published: Path, tasks: list[str]) -> None:
    """A burst of requests of `tasks` and `text-matching`, all at once, each answered with its own task's vectors."""
    burst = [*tasks, "text-matching"] * 4
    expected = {task: reference(published, task) for task in set(burst)}
    with live.client() as client, ThreadPoolExecutor(len(burst)) as pool:
        embed(client, SENTENCES[:1])  # loaded before the burst, so that the requests queue together
        answers = list(pool.map(lambda task: embed(client, SENTENCES, task=task), burst))
    for task, got in zip(burst, answers, strict=True):
        np.testing.assert_allclose(got, expected[task], atol=1e-4)


def test_roles_and_prompt_names_choose_the_task_and_no_task_runs_the_base(
    serve: Any, published: Path, engine_cache: Path
) -> None:
    """prompt_name "query" and Cohere's input_type pick the adapter and its instruction; a named
    prompt of the model's own is its text; without a task the base weights run, as the hub code's."""
    live = serve({"models": [entry(published)]})
    with live.client() as client:
        query = embed(client, SENTENCES, prompt_name="query")
        named = embed(client, SENTENCES, prompt_name="retrieval.query")
        base = embed(client, SENTENCES)
        body = {"model": "jina", "texts": SENTENCES, "input_type": "search_document", "embedding_types": ["float"]}
        cohere = client.post("/v2/embed", json=body)
    assert cohere.status_code == 200, cohere.text
    assert np.abs(reference(published, "retrieval.query", "") - reference(published, None)).max() > 0.05
    np.testing.assert_allclose(query, reference(published, "retrieval.query"), atol=1e-4)
    np.testing.assert_allclose(named, query, atol=1e-5)
    np.testing.assert_allclose(base, reference(published, None), atol=1e-4)
    passage = np.asarray(cohere.json()["embeddings"]["float"])
    np.testing.assert_allclose(passage, reference(published, "retrieval.passage"), atol=1e-4)


def test_the_default_task_is_the_entry_s(serve: Any, published: Path, engine_cache: Path) -> None:
    live = serve({"models": [entry(published, options={"default_task": "separation"})]})
    with live.client() as client:
        got = embed(client, SENTENCES)
    np.testing.assert_allclose(got, reference(published, "separation"), atol=1e-4)


def test_an_unknown_task_or_a_task_on_a_model_without_adapters_is_a_400(
    serve: Any, published: Path, engine_cache: Path, tmp_path: Path
) -> None:
    plain = tiny_bert(tmp_path / "bert")
    live = serve({"models": [entry(published), {"name": "bert", "source": str(plain), "backend": "torch"}]})
    with live.client() as client:
        unknown = client.post("/v1/embeddings", json={"model": "jina", "input": ["a"], "task": "retrieval"})
        elsewhere = client.post("/v1/embeddings", json={"model": "bert", "input": ["a"], "task": "retrieval.query"})
        encode = client.post("/v1/encode", json={"model": "bert", "input": ["a"], "task": "separation"})
        assert client.get("/health").status_code == 200
    assert unknown.status_code == 400, unknown.text
    message = unknown.json()["error"]["message"]
    assert "unknown task 'retrieval'" in message
    assert all(task in message for task in TASKS)
    for answer in (elsewhere, encode):
        assert answer.status_code == 400, answer.text
        assert "no task adapters" in answer.json()["error"]["message"]


def test_a_default_task_the_model_lacks_is_refused_naming_the_tasks(
    serve: Any, published: Path, engine_cache: Path
) -> None:
    live = serve({"models": [entry(published, options={"default_task": "clustering"})]})
    with live.client() as client:
        answer = client.post("/v1/embeddings", json={"model": "jina", "input": ["a"]})
    assert answer.status_code == 503, answer.text
    assert "default_task 'clustering'" in answer.json()["error"]["message"]
    assert "text-matching" in answer.json()["error"]["message"]


def test_a_checkpoint_missing_a_layer_s_adapters_is_refused_naming_it(
    serve: Any, tmp_path: Path, engine_cache: Path
) -> None:
    """Served without them, that layer would run its base weights under every task."""
    from safetensors.torch import load_file, save_file

    directory = tiny_jina_v3(tmp_path / "jina")
    weights = load_file(directory / "model.safetensors")
    kept = {k: v for k, v in weights.items() if not ("layers.1.mlp.fc2" in k and ".lora_" in k)}
    save_file(kept, directory / "model.safetensors", metadata={"format": "pt"})
    live = serve({"models": [entry(directory)]})
    with live.client() as client:
        answer = client.post("/v1/embeddings", json={"model": "jina", "input": ["a"], "task": "separation"})
        assert client.get("/health").status_code == 200
    assert answer.status_code == 503, answer.text
    assert "without task adapters for layers.1.mlp.fc2" in answer.json()["error"]["message"]


@pytest.mark.parametrize("adapters", ["folders", "weights"])
def test_a_converted_checkpoint_with_task_adapters_is_refused_not_served_on_its_base(
    serve: Any, tmp_path: Path, adapters: str
) -> None:
    """transformers' jina_embeddings_v3 port runs the base weights: served, every task would get them."""
    directory = tiny_jina_v3_hf(tmp_path / "jina-hf", adapters=adapters)
    live = serve({"models": [entry(directory)]})
    with live.client() as client:
        answer = client.post("/v1/embeddings", json={"model": "jina", "input": ["a"]})
        assert client.get("/health").status_code == 200
    assert answer.status_code == 503, answer.text
    message = answer.json()["error"]["message"]
    assert "task adapters" in message
    assert "jinaai/jina-embeddings-v3" in message
    assert ("retrieval.query" if adapters == "folders" else "LoRA weight(s)") in message


def test_a_converted_checkpoint_without_adapters_serves_its_base_weights(serve: Any, tmp_path: Path) -> None:
    directory = tiny_jina_v3_hf(tmp_path / "jina-hf")
    live = serve({"models": [entry(directory)]})
    with live.client() as client:
        got = embed(client, SENTENCES)
        single = [embed(client, [s])[0] for s in SENTENCES]
        details = client.get("/v1/models/jina").json()["details"]
    np.testing.assert_allclose(got, reference(directory, None), atol=1e-4)
    np.testing.assert_allclose(single, got, atol=1e-5)
    assert "task_adapters" not in details


# ---- on ONNX Runtime: the export carries every task's adapter and takes the task as an input ----


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One engine cache for the module: the model is exported once."""
    return tmp_path_factory.mktemp("onnx-cache")


def on_onnx(directory: Path, cache: Path, **extra: Any) -> dict[str, Any]:
    return {"models": [entry(directory, backend="onnx", device="cpu", **extra)], "engine_cache": str(cache)}


@pytest.mark.slow
def test_on_onnx_each_task_and_the_base_answer_as_their_adapters_merged(
    serve: Any, published: Path, onnx_cache: Path
) -> None:
    live = serve(on_onnx(published, onnx_cache))
    with live.client() as client:
        for task in (None, *TASKS):
            options = {} if task is None else {"task": task}
            batched = embed(client, SENTENCES, **options)
            np.testing.assert_allclose(batched, reference(published, task), atol=1e-4)
            single = [embed(client, [s], **options)[0] for s in SENTENCES]
            np.testing.assert_allclose(single, batched, atol=1e-5)
        details = client.get("/v1/models/jina").json()["details"]
    assert (details["engine"]["backend"], details["engine"]["own_file"]) == ("onnx", False)
    assert details["task_adapters"]["tasks"] == list(TASKS)


def test_on_onnx_requests_of_different_tasks_at_once_each_get_their_own(
    serve: Any, published: Path, onnx_cache: Path
) -> None:
    each_task_at_once_gets_its_own(
        serve(on_onnx(published, onnx_cache)), published, ["retrieval.passage", "separation"]
    )


def test_int8_with_auto_runs_on_onnx_and_keeps_each_task_s_direction(
    serve: Any, published: Path, onnx_cache: Path
) -> None:
    """CTranslate2, first in `auto`'s int8 row, cannot run the adapters; every vector keeps the
    direction of its own task's (the tasks' own vectors are further apart than that)."""
    live = serve({"models": [entry(published, backend="auto", quantize="int8")], "engine_cache": str(onnx_cache)})
    with live.client() as client:
        got = {task: embed(client, SENTENCES, task=task) for task in TASKS}
        engine = client.get("/v1/models/jina").json()["details"]["engine"]
    assert (engine["backend"], engine["precision"]) == ("onnx", "int8")
    assert engine["reason"].startswith("auto: onnx, "), engine["reason"]
    for task in TASKS:
        cosines = (got[task] * reference(published, task)).sum(axis=1)
        assert cosines.min() >= 0.99, f"{task}: {cosines}"
    apart = (reference(published, "separation") * reference(published, "text-matching")).sum(axis=1)
    assert apart.max() < 0.99


def test_ctranslate2_is_refused_at_start_naming_the_engines_that_run_it(published: Path) -> None:
    from model_registry import Registry
    from model_registry.config import registry_config
    from model_registry.errors import ConfigError

    config = registry_config({"models": [entry(published, backend="ctranslate2")]})
    with pytest.raises(ConfigError) as refused:
        Registry(config)
    message = str(refused.value)
    assert "architecture 'jina_embeddings_v3' cannot run on backend: ctranslate2" in message
    assert message.endswith("use backend: onnx, or backend: torch"), message


def test_the_view_leaves_the_checkpoint_s_own_onnx_graphs_out(tmp_path: Path) -> None:
    """Published graphs select tasks by their own convention; ONNX Runtime runs an export of the view."""
    from model_registry.config import ModelSpec
    from model_registry.detection.layout import detect

    directory = tiny_jina_v3(tmp_path / "jina")
    (directory / "onnx").mkdir()
    (directory / "onnx" / "model.onnx").write_bytes(b"a graph of its own")
    layout = detect(directory, ModelSpec(name="jina", source=str(directory)))
    assert (layout.transformer_dir / "tokenizer.json").is_file()
    assert not (layout.transformer_dir / "onnx").exists()


def test_a_graph_that_does_not_take_the_task_is_refused_not_served_on_its_base(
    published: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ONNX graph without `task_id` would answer every task with the base weights."""
    from model_registry.adapters.base import LoadOptions
    from model_registry.adapters.dense import DenseAdapter
    from model_registry.adapters.jina_lora import JinaLoraAdapter
    from model_registry.backends.onnx.engine import OnnxEngine
    from model_registry.config import ModelSpec
    from model_registry.detection.layout import detect
    from model_registry.errors import ModelUnavailable

    graph = OnnxEngine()
    graph.inputs = frozenset({"input_ids", "attention_mask"})

    def load_a_graph_without_the_task(adapter: DenseAdapter, options: LoadOptions) -> None:
        adapter.engine = graph

    monkeypatch.setattr(DenseAdapter, "load", load_a_graph_without_the_task)
    adapter = JinaLoraAdapter(detect(published, ModelSpec(name="jina", source=str(published))))
    with pytest.raises(ModelUnavailable, match=r"does not take 'task_id'.*backend: torch"):
        adapter.load(LoadOptions(device="cpu", dtype="float32", max_batch_tokens=256))
