"""LoRA adapters in PEFT's format, chosen per request: over HTTP, each answer equals PEFT's merged
model for its adapter in sentence-transformers, requests for different adapters running at once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from infinity_server.app import create_app
from infinity_server.settings import ServerSettings, Settings
from model_registry.config import registry_config
from tests.builders.peft import merged, save_adapter
from tests.builders.text import tiny_bert
from tests.conftest import LiveServer, start_server

pytestmark = pytest.mark.integration

TEXTS = ["a contract clause on liability", "the patient reports chest pain", "short", "a longer sentence " * 6]
#: Two adapters of other ranks, scales and layers: `legal` on the attention's query and value,
#: `medical` (rsLoRA) on the key and every dense layer.
ADAPTERS: dict[str, dict[str, Any]] = {
    "legal": {"r": 4, "lora_alpha": 8, "target_modules": ["query", "value"]},
    "medical": {"r": 2, "lora_alpha": 3, "target_modules": ["key", "dense"], "use_rslora": True},
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("peft")
    base = tiny_bert(root / "base")
    found = {"base": base}
    for seed, (name, settings) in enumerate(ADAPTERS.items(), start=1):
        found[name] = save_adapter(base, root / name, seed, **settings)
    return found


def reference(files: dict[str, Path], adapter: str | None) -> np.ndarray:
    """sentence-transformers on the base model, or on PEFT's merge of `adapter` into it."""
    vectors: np.ndarray = merged(files["base"], files[adapter] if adapter else None).encode(TEXTS)
    return vectors


@pytest.fixture(scope="module")
def server(files: dict[str, Path]) -> Iterator[LiveServer]:
    entry = {
        "name": "tuned",
        "source": str(files["base"]),
        "adapters": {name: str(files[name]) for name in ADAPTERS},
    }
    live = start_server(create_app(Settings(ServerSettings(access_log=False), registry_config({"models": [entry]}))))
    yield live
    live.close()


def embed(client: httpx.Client, texts: list[str], **extra: Any) -> httpx.Response:
    return client.post("/v1/embeddings", json={"model": "tuned", "input": texts, **extra})


def vectors(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)


def test_each_adapter_equals_peft_merged_and_requests_run_at_once(server: LiveServer, files: dict[str, Path]) -> None:
    choices: list[str | None] = [None, "legal", "medical"] * 4
    with server.client() as client, ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda a: vectors(embed(client, TEXTS, **({"adapter": a} if a else {}))), choices))
        by_task = vectors(embed(client, TEXTS, task="legal"))
        listed = client.get("/v1/models").json()["data"]
    for choice, got in zip(choices, answers, strict=True):
        np.testing.assert_allclose(got, reference(files, choice), atol=1e-4)
    np.testing.assert_array_equal(by_task, answers[1])
    assert not np.allclose(answers[1], answers[2], atol=1e-2), "the adapters must change the vectors"
    (model,) = [m for m in listed if m["id"] == "tuned"]
    assert json.dumps(model).count("medical") >= 1


def test_batched_equals_single(server: LiveServer) -> None:
    with server.client() as client:
        together = vectors(embed(client, TEXTS, adapter="medical"))
        alone = np.concatenate([vectors(embed(client, [text], adapter="medical")) for text in TEXTS])
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_an_unknown_adapter_and_two_choices_are_refused(server: LiveServer) -> None:
    with server.client() as client:
        unknown = embed(client, ["a"], adapter="finance")
        both = embed(client, ["a"], adapter="legal", task="medical")
        health = client.get("/health")
    assert unknown.status_code == 400
    assert "finance" in unknown.text
    assert "legal" in unknown.text
    assert "medical" in unknown.text
    assert both.status_code == 422
    assert health.status_code == 200


def test_adapters_refused_where_they_cannot_run(files: dict[str, Path]) -> None:
    from model_registry import ConfigError

    base, adapters = str(files["base"]), {"legal": str(files["legal"])}
    with pytest.raises(ConfigError, match="adapters run on backend: torch"):
        registry_config({"models": [{"name": "m", "source": base, "backend": "onnx", "adapters": adapters}]})
    with pytest.raises(ConfigError, match="adapters run on unquantized weights"):
        registry_config({"models": [{"name": "m", "source": base, "quantize": "int8", "adapters": adapters}]})
    with pytest.raises(ConfigError, match="adapter name"):
        registry_config({"models": [{"name": "m", "source": base, "adapters": {"a b": "x"}}]})


async def test_an_adapter_of_another_base_model_fails_the_load_naming_it(
    files: dict[str, Path], tmp_path: Path
) -> None:
    from model_registry import ModelUnavailable, Registry

    wide = tiny_bert(tmp_path / "other")
    config = json.loads((wide / "config.json").read_text())
    config["hidden_size"] = int(config["hidden_size"]) * 2
    config["intermediate_size"] = int(config["intermediate_size"]) * 2
    from transformers import BertConfig, BertModel

    bigger = tmp_path / "bigger"
    BertModel(BertConfig(**{k: v for k, v in config.items() if k != "architectures"})).save_pretrained(str(bigger))
    foreign = save_adapter(bigger, tmp_path / "foreign", 5, r=2, lora_alpha=2, target_modules=["query"])
    entry = {"name": "m", "source": str(files["base"]), "adapters": {"foreign": str(foreign)}}
    async with Registry.from_config({"models": [entry]}) as registry:
        with pytest.raises(ModelUnavailable, match=r"adapter 'foreign'.*another base model"):
            await registry.embed("m", ["a"], task="foreign")
