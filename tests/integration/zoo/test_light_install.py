"""The install without torch: `.venv-light`, which `scripts/setup` makes with the project's own
dependencies and its `onnx` extra alone (neither torch nor transformers), serves static models and
text embedders that ship their ONNX graph.

The server runs there as users run it (`infinity-server serve`, a real port), and answers as
model2vec's `StaticModel.encode` and `SentenceTransformer.encode` answer on torch in the full
install. A model that needs torch there (one that ships no graph, a media model) stops the start
with an error naming the model and the extra that serves it.
"""

from __future__ import annotations

import base64
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.builders.embedders import tiny_qwen3, tiny_xlmr
from tests.builders.media import tiny_clip
from tests.builders.onnx import ship_graph
from tests.builders.static import tiny_model2vec, tiny_static_embedding
from tests.builders.text import tiny_bert
from tests.builders.zoo import tiny_cross_encoder
from tests.conftest import REPO, free_port
from tests.integration.zoo.test_static import reference

pytestmark = pytest.mark.integration

LIGHT = Path(os.environ.get("LIGHT_VENV", REPO / ".venv-light"))
TEXTS = ["The cat sleeps on the warm windowsill.", "qqq hello world, qqq", "Two dogs run through the snow.", "a"]
#: The int8 file a CPU with these flags runs, as sentence-transformers names its exports (written
#: down here, not read from the server's table).
INT8_FOR_FLAGS = (
    ("avx512_vnni", "model_qint8_avx512_vnni.onnx"),
    ("avx512f", "model_qint8_avx512.onnx"),
    ("avx2", "model_quint8_avx2.onnx"),
)
SHIPPED_INT8 = ("model_qint8_avx512_vnni.onnx", "model_qint8_avx512.onnx", "model_quint8_avx2.onnx")
DENSE = "torch.nn.modules.activation.Tanh"


@pytest.fixture(scope="module")
def python() -> Path:
    executable = LIGHT / "bin" / "python"
    if not executable.is_file():
        pytest.fail(f"{LIGHT} is missing: scripts/setup makes it (the install without torch)")
    return executable


def run(python: Path, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120, check=False)


def test_the_light_install_has_onnx_runtime_but_neither_torch_nor_transformers(python: Path) -> None:
    for name in ("torch", "transformers", "sentence_transformers", "ctranslate2", "onnx", "onnxscript"):
        done = run(python, f"import {name}")
        assert done.returncode != 0, f"{name} imports in {LIGHT}"
        assert "ModuleNotFoundError" in done.stderr
    assert run(python, "import onnxruntime, infinity_server.app, model_registry").returncode == 0


#: What the light install's packages may weigh: 256 MiB when written (the project, its dependencies and ONNX
#: Runtime's); torch alone would be gigabytes.
LIGHT_MB = 400


def test_the_light_install_stays_light(python: Path) -> None:
    done = run(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    packages = Path(done.stdout.strip())
    size = sum(f.stat().st_size for f in packages.rglob("*") if f.is_file() and not f.is_symlink())
    assert size < LIGHT_MB * 1024 * 1024, f"{LIGHT} holds {size / 2**20:.0f} MiB of packages"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("light-models")
    prompts = {"query": "query: "}
    return {
        "potion": tiny_model2vec(root / "potion"),
        "static": tiny_static_embedding(root / "static", normalize=True),
        # mean pooling, a Dense layer, a prompt kept out of the pooling
        "bert": ship_graph(tiny_bert(root / "bert", dense=(16, DENSE), prompts=prompts, include_prompt=False)),
        "xlmr": ship_graph(tiny_xlmr(root / "xlmr")),  # a Unigram tokenizer; positions after the pad id
        "qwen3": ship_graph(tiny_qwen3(root / "qwen3")),  # last-token pooling, left padding
        "int8": ship_graph(tiny_bert(root / "int8", pooling="cls", seed=1), quantized=SHIPPED_INT8),
        # a pair's segment ids, a wide head: scores far apart
        "reranker": ship_graph(
            tiny_cross_encoder(root / "reranker", segment_ids=True, initializer_range=0.3),
            task="sequence-classification",
        ),
    }


def start(config: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [str(LIGHT / "bin" / "infinity-server"), "serve", "--config", str(config), "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with log.open("wb") as out:
        process = subprocess.Popen([*command, "--host", "127.0.0.1"], env=env, stdout=out, stderr=subprocess.STDOUT)
    return process, f"http://127.0.0.1:{port}"


def entries(models: dict[str, Any]) -> str:
    lines = []
    for name, value in models.items():
        source, extra = value if isinstance(value, tuple) else (value, "")
        lines.append(f"  - name: {name}\n    source: {source}\n{extra}")
    return "models:\n" + "".join(lines)


@pytest.fixture(scope="module")
def server(python: Path, models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("light")
    config = root / "models.yaml"
    listed: dict[str, Any] = dict(models)
    listed["int8"] = (models["int8"], "    quantize: int8\n")
    listed["fp32"] = models["int8"]
    config.write_text(entries(listed))
    process, url = start(config, root / "server.log")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert process.poll() is None, (root / "server.log").read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        else:
            pytest.fail("the light install's server never answered /health")
        yield url
    finally:
        process.terminate()
        process.wait(15)


def embed(server: str, model: str, texts: list[str], **extra: Any) -> tuple[np.ndarray, dict[str, Any]]:
    with httpx.Client(base_url=server, timeout=60) as client:
        body = {"model": model, "input": texts, "encoding_format": "base64", **extra}
        answer = client.post("/v1/embeddings", json=body)
        details = client.get(f"/v1/models/{model}").json()
    assert answer.status_code == 200, answer.text
    rows = [np.frombuffer(base64.b64decode(r["embedding"]), dtype=np.float32) for r in answer.json()["data"]]
    return np.stack(rows), details


@pytest.mark.parametrize("model", ["potion", "static"])
def test_a_static_model_serves_as_its_library_in_the_light_install(
    server: str, models: dict[str, Path], model: str
) -> None:
    got, details = embed(server, model, TEXTS)
    np.testing.assert_allclose(got, reference(models[model], TEXTS), atol=1e-5)
    assert details["backend"] == "numpy"


def sentence_transformers(directory: Path, texts: list[str], **options: Any) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return np.asarray(SentenceTransformer(str(directory), device="cpu").encode(texts, **options))


@pytest.mark.parametrize("model", ["bert", "xlmr", "qwen3", "fp32"])
def test_a_model_that_ships_its_graph_answers_as_sentence_transformers_on_torch(
    server: str, models: dict[str, Path], model: str
) -> None:
    got, details = embed(server, model, TEXTS)
    directory = models["int8" if model == "fp32" else model]
    np.testing.assert_allclose(got, sentence_transformers(directory, TEXTS), atol=1e-5)
    # one at a time: the batch's padding changes nothing
    alone = np.concatenate([embed(server, model, [text])[0] for text in TEXTS])
    np.testing.assert_allclose(alone, got, atol=1e-6)
    engine = details["details"]["engine"]
    assert (details["backend"], engine["own_file"]) == ("onnx", True)
    assert engine["artifact"] == f"{directory.name}/onnx/model.onnx"
    assert "torch is not installed" in engine["reason"]


def test_a_prompt_is_left_out_of_the_pooling_as_the_model_says(server: str, models: dict[str, Path]) -> None:
    got, _ = embed(server, "bert", TEXTS, prompt_name="query")
    np.testing.assert_allclose(got, sentence_transformers(models["bert"], TEXTS, prompt_name="query"), atol=1e-5)


def test_int8_runs_the_variant_made_for_this_cpu(server: str, models: dict[str, Path]) -> None:
    from model_registry.backends.choice import cpu_flags

    flags = cpu_flags()
    expected = next((name for flag, name in INT8_FOR_FLAGS if flag in flags), None)
    if expected is None:
        pytest.skip("this CPU has none of the instruction sets the shipped variants are made for")
    got, details = embed(server, "int8", TEXTS)
    assert details["details"]["engine"]["artifact"] == f"int8/onnx/{expected}"
    assert details["details"]["engine"]["precision"] == "int8"
    fp32 = sentence_transformers(models["int8"], TEXTS)
    cosine = (got * fp32).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(fp32, axis=1)
    assert cosine.min() > 0.99, cosine


def test_tokenize_answers_as_transformers(server: str, models: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    for model in ("bert", "xlmr", "qwen3"):
        tokenizer = AutoTokenizer.from_pretrained(str(models[model]))
        with httpx.Client(base_url=server, timeout=60) as client:
            answer = client.post("/tokenize", json={"model": model, "inputs": TEXTS})
        assert answer.status_code == 200, answer.text
        ids = [[token["id"] for token in row] for row in answer.json()]
        assert ids == [tokenizer(text)["input_ids"] for text in TEXTS], model


def test_a_cross_encoder_that_ships_its_graph_ranks_as_sentence_transformers(
    server: str, models: dict[str, Path]
) -> None:
    from sentence_transformers import CrossEncoder

    query, documents = "a cat on a warm windowsill", [*TEXTS, "the cat " * 60]
    expected = CrossEncoder(str(models["reranker"]), device="cpu").predict([(query, d) for d in documents])
    with httpx.Client(base_url=server, timeout=60) as client:
        body = {"model": "reranker", "query": query, "documents": documents}
        ranked = client.post("/rerank", json=body)
        alone = [
            client.post("/rerank", json={**body, "documents": [d]}).json()["results"][0]["relevance_score"]
            for d in documents
        ]
        details = client.get("/v1/models/reranker").json()
    assert ranked.status_code == 200, ranked.text
    got = {r["index"]: r["relevance_score"] for r in ranked.json()["results"]}
    np.testing.assert_allclose([got[i] for i in range(len(documents))], expected, atol=1e-5)
    np.testing.assert_allclose(alone, expected, atol=1e-5)
    assert (details["kind"], details["backend"]) == ("reranker", "onnx")
    assert details["details"]["activation"] == "sigmoid"


def refusal(tmp_path: Path, models: dict[str, Any]) -> str:
    """What the light install's server says when it refuses to start with `models`."""
    config = tmp_path / "models.yaml"
    config.write_text(entries(models))
    process, _ = start(config, tmp_path / "server.log")
    try:
        code = process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("the light install's server started with a model that needs torch")
    assert code != 0
    return (tmp_path / "server.log").read_text()


def test_a_model_without_its_graph_stops_the_start_naming_the_export_extra(python: Path, tmp_path: Path) -> None:
    said = refusal(tmp_path, {"plain": tiny_bert(tmp_path / "plain")})
    assert "model 'plain'" in said
    assert "ships no onnx/model.onnx" in said
    assert "pip install 'infinity-server[onnx-export]'" in said


def test_a_media_model_stops_the_start_naming_the_torch_extra(python: Path, tmp_path: Path) -> None:
    said = refusal(tmp_path, {"clip": tiny_clip(tmp_path / "clip")})
    assert "model 'clip'" in said
    assert "pip install 'infinity-server[torch]'" in said


def test_an_engine_that_needs_torch_stops_the_start(python: Path, models: dict[str, Path], tmp_path: Path) -> None:
    said = refusal(tmp_path, {"bert": (models["bert"], "    backend: torch\n")})
    assert "backend: torch needs torch" in said
    assert "pip install 'infinity-server[torch]'" in said
