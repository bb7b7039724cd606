"""The install without torch: `.venv-light`, which `scripts/setup` makes with the project's own
dependencies alone (no extra, so neither torch nor transformers), serves static models.

The server runs there as users run it (`infinity-server serve`, a real port), and answers as
model2vec's `StaticModel.encode` and `SentenceTransformer.encode` answer in the full install; a
model that needs torch in the same configuration is a 503 naming the extra that adds it, and does
not stop the others.
"""

from __future__ import annotations

import base64
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.builders.static import tiny_model2vec, tiny_static_embedding
from tests.builders.text import tiny_bert
from tests.conftest import REPO, free_port
from tests.integration.zoo.test_static import reference

pytestmark = pytest.mark.integration

LIGHT = Path(os.environ.get("LIGHT_VENV", REPO / ".venv-light"))
TEXTS = ["The cat sleeps on the warm windowsill.", "qqq hello world, qqq", "Two dogs run through the snow."]


@pytest.fixture(scope="module")
def python() -> Path:
    executable = LIGHT / "bin" / "python"
    if not executable.is_file():
        pytest.fail(f"{LIGHT} is missing: scripts/setup makes it (the install without torch)")
    return executable


def run(python: Path, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120, check=False)


def test_the_light_install_has_neither_torch_nor_transformers(python: Path) -> None:
    for name in ("torch", "transformers", "sentence_transformers", "onnxruntime", "ctranslate2"):
        done = run(python, f"import {name}")
        assert done.returncode != 0, f"{name} imports in {LIGHT}"
        assert "ModuleNotFoundError" in done.stderr
    assert run(python, "import infinity_server.app, model_registry").returncode == 0


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("light-models")
    return {
        "potion": tiny_model2vec(root / "potion"),
        "static": tiny_static_embedding(root / "static", normalize=True),
        "bert": tiny_bert(root / "bert"),
    }


@pytest.fixture(scope="module")
def server(python: Path, models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("light")
    config = root / "models.yaml"
    config.write_text("models:\n" + "".join(f"  - name: {n}\n    source: {p}\n" for n, p in models.items()))
    port = free_port()
    command = [str(LIGHT / "bin" / "infinity-server"), "serve", "--config", str(config), "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with (root / "server.log").open("wb") as log:
        process = subprocess.Popen([*command, "--host", "127.0.0.1"], env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
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


@pytest.mark.parametrize("model", ["potion", "static"])
def test_a_static_model_serves_as_its_library_in_the_light_install(
    server: str, models: dict[str, Path], model: str
) -> None:
    with httpx.Client(base_url=server, timeout=60) as client:
        answer = client.post("/v1/embeddings", json={"model": model, "input": TEXTS, "encoding_format": "base64"})
        details = client.get(f"/v1/models/{model}").json()
    assert answer.status_code == 200, answer.text
    got = np.stack([np.frombuffer(base64.b64decode(r["embedding"]), dtype=np.float32) for r in answer.json()["data"]])
    np.testing.assert_allclose(got, reference(models[model], TEXTS), atol=1e-5)
    assert details["backend"] == "numpy"


def test_a_model_that_needs_torch_is_a_503_naming_the_extra(server: str) -> None:
    with httpx.Client(base_url=server, timeout=60) as client:
        refused = client.post("/v1/embeddings", json={"model": "bert", "input": TEXTS})
        served = client.post("/v1/embeddings", json={"model": "potion", "input": TEXTS})
        health = client.get("/health")
    assert refused.status_code == 503, refused.text
    assert "pip install 'infinity-server[torch]'" in refused.json()["error"]["message"]
    assert served.status_code == 200
    assert health.status_code == 200
