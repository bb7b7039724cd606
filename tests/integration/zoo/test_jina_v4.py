"""jina-embeddings-v4 over HTTP on a tiny random model in the published layout, against the recipe of
the model's `modeling_jina_embeddings_v4.py` written out here: transformers'
`Qwen2_5_VLForConditionalGeneration` with `multi_vector_projector` beside it, the task's LoRA
merged by PEFT (`PeftModel.from_pretrained(...).merge_and_unload()` on that task's factors of the
published multi-task adapter), "Query: " or "Passage: " before a text (text-matching always
"Query: "), the published image prompt, the last hidden state (`hidden_states[-1]`) mean-pooled
over a text's tokens or an image's vision span and L2-normalised, and the projector's output per
token, L2-normalised, for multi-vectors. One input at a time, in float32."""

from __future__ import annotations

import base64
import io
import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from infinity_server.app import create_app
from infinity_server.settings import ServerSettings, Settings
from model_registry.config import registry_config
from tests.builders.jina_v4 import TASKS, published_class, tiny_jina_v4
from tests.builders.peft import peft_quietly
from tests.conftest import LiveServer, start_server

pytestmark = pytest.mark.integration

TEXTS = ["a cat sleeps on the warm windowsill", "two dogs run through the snow", "What is the capital?"]
IMAGE_PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe the image.<|im_end|>\n"
TOLERANCE = 1e-4


def picture(width: int, height: int, seed: int, mode: str = "RGB") -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, len(mode)), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode=mode).save(buffer, format="PNG")
    return buffer.getvalue()


#: An ordinary size, a tiny one (scaled up to the processor's min pixels), an RGBA one (its alpha
#: dropped) and one past the max pixels (scaled down).
IMAGES = [picture(90, 50, 1), picture(20, 20, 2), picture(70, 60, 3, "RGBA"), picture(400, 300, 4)]


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


# ---- the reference --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    dense: np.ndarray
    multivector: np.ndarray
    tokens: int


def single_task_adapter(published: Path, task: str, into: Path) -> Path:
    """The published multi-task adapter's factors of `task` as a plain PEFT LoRA adapter."""
    from safetensors.torch import load_file, save_file

    into.mkdir(parents=True, exist_ok=True)
    shutil.copy(published / "adapter_config.json", into / "adapter_config.json")
    marker = f".{task}.weight"
    stored = load_file(str(published / "adapter_model.safetensors"))
    chosen = {k.removesuffix(marker) + ".weight": v for k, v in stored.items() if k.endswith(marker)}
    save_file(chosen, str(into / "adapter_model.safetensors"))
    return into


class Reference:
    def __init__(self, root: Path, scratch: Path) -> None:
        from transformers import Qwen2_5_VLProcessor

        self.processor = Qwen2_5_VLProcessor.from_pretrained(str(root))
        self.config = json.loads((root / "config.json").read_text())
        self.models = {task: self._merged(root, task, scratch / task) for task in TASKS}

    @staticmethod
    def _merged(root: Path, task: str, scratch: Path) -> Any:
        from peft import PeftModel

        base = published_class().from_pretrained(str(root)).eval()
        adapter = single_task_adapter(root / "adapters", task, scratch)
        with peft_quietly():
            return PeftModel.from_pretrained(base, str(adapter)).merge_and_unload().eval()

    def text(self, text: str, task: str = "retrieval", prompt_name: str = "query") -> Expected:
        prefix = "Query" if prompt_name == "query" or task == "text-matching" else "Passage"
        encoded = self.processor(text=[f"{prefix}: {text}"], return_tensors="pt", truncation=True, max_length=32768)
        return self._run(encoded, task, image=False)

    def image(self, data: bytes, task: str = "retrieval") -> Expected:
        from PIL import Image

        image = Image.open(io.BytesIO(data)).convert("RGB")
        encoded = self.processor(text=[IMAGE_PROMPT], images=[image], return_tensors="pt")
        return self._run(encoded, task, image=True)

    def _run(self, encoded: Any, task: str, *, image: bool) -> Expected:
        model, ids, mask = self.models[task], encoded["input_ids"], encoded["attention_mask"]
        with torch.no_grad():
            hidden = model(**encoded, output_hidden_states=True).hidden_states[-1]
            if image:
                positions = torch.arange(ids.shape[1])
                start = torch.where(ids == self.config["vision_start_token_id"])[1]
                end = torch.where(ids == self.config["vision_end_token_id"])[1]
                pooled_mask = ((positions >= start[:, None]) & (positions <= end[:, None])).float()
            else:
                pooled_mask = mask.float()
            pooled = (hidden * pooled_mask[..., None]).sum(dim=1) / pooled_mask.sum(dim=1, keepdim=True)
            dense = torch.nn.functional.normalize(pooled, dim=-1)[0]
            multi = torch.nn.functional.normalize(model.multi_vector_projector(hidden), dim=-1) * mask[..., None]
        rows = multi[0][mask[0].bool()]
        return Expected(dense.numpy(), rows.numpy(), int(mask.sum()))


# ---- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_jina_v4(tmp_path_factory.mktemp("jina-v4") / "jina-embeddings-v4")


@pytest.fixture(scope="module")
def reference(files: Path, tmp_path_factory: pytest.TempPathFactory) -> Reference:
    return Reference(files, tmp_path_factory.mktemp("single-task-adapters"))


@pytest.fixture(scope="module")
def server(files: Path) -> Iterator[LiveServer]:
    entry = {"name": "jina", "source": str(files)}
    live = start_server(create_app(Settings(ServerSettings(access_log=False), registry_config({"models": [entry]}))))
    yield live
    live.close()


@pytest.fixture
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as opened:
        yield opened


def vectors(answer: httpx.Response) -> np.ndarray:
    assert answer.status_code == 200, answer.text
    return np.array([row["embedding"] for row in answer.json()["data"]], dtype=np.float32)


def embed(client: httpx.Client, inputs: list[str], **options: Any) -> np.ndarray:
    return vectors(client.post("/v1/embeddings", json={"model": "jina", "input": inputs, **options}))


def multivectors(client: httpx.Client, inputs: list[str], **options: Any) -> list[np.ndarray]:
    body = {"model": "jina", "input": inputs, "outputs": ["multivector"], **options}
    answer = client.post("/v1/encode", json=body)
    assert answer.status_code == 200, answer.text
    return [np.array(row["multivector"], dtype=np.float32) for row in answer.json()["data"]]


def images_body(images: list[bytes], **options: Any) -> dict[str, Any]:
    return {"model": "jina", "input": [data_uri(i) for i in images], "modality": "image", **options}


# ---- tests --------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("prompt_name", ["query", "passage"])
def test_texts_match_the_reference_for_each_task_and_role(
    client: httpx.Client, reference: Reference, task: str, prompt_name: str
) -> None:
    answer = client.post(
        "/v1/embeddings", json={"model": "jina", "input": TEXTS, "task": task, "prompt_name": prompt_name}
    )
    expected = [reference.text(t, task, prompt_name) for t in TEXTS]
    np.testing.assert_allclose(vectors(answer), np.stack([e.dense for e in expected]), atol=TOLERANCE)
    assert answer.json()["usage"]["prompt_tokens"] == sum(e.tokens for e in expected)


def test_the_defaults_are_retrieval_and_the_query_prompt(client: httpx.Client, reference: Reference) -> None:
    got = embed(client, TEXTS)
    np.testing.assert_allclose(got, np.stack([reference.text(t).dense for t in TEXTS]), atol=TOLERANCE)
    passages = np.stack([reference.text(t, "retrieval", "passage").dense for t in TEXTS])
    other = np.stack([reference.text(t, "code").dense for t in TEXTS])
    assert np.abs(got - passages).max() > 1e-3  # the prompt changes the vectors
    assert np.abs(got - other).max() > 1e-3  # and so does the task's adapter


def test_the_adapter_field_chooses_the_task_too(client: httpx.Client, reference: Reference) -> None:
    got = embed(client, TEXTS, adapter="code")
    np.testing.assert_allclose(got, np.stack([reference.text(t, "code").dense for t in TEXTS]), atol=TOLERANCE)


@pytest.mark.parametrize("task", TASKS)
def test_images_match_the_reference(client: httpx.Client, reference: Reference, task: str) -> None:
    answer = client.post("/v1/embeddings", json=images_body(IMAGES, task=task))
    expected = [reference.image(i, task) for i in IMAGES]
    np.testing.assert_allclose(vectors(answer), np.stack([e.dense for e in expected]), atol=TOLERANCE)
    # Visual tokens count in usage: each image is its whole sequence, known before the forward pass.
    assert answer.json()["usage"]["prompt_tokens"] == sum(e.tokens for e in expected)
    assert len({e.tokens for e in expected}) > 1


@pytest.mark.parametrize("task", TASKS)
def test_multivectors_of_texts_and_images_match_the_reference(
    client: httpx.Client, reference: Reference, task: str
) -> None:
    texts = multivectors(client, TEXTS, task=task, prompt_name="passage")
    images = multivectors(client, [data_uri(i) for i in IMAGES[:2]], task=task, modality="image")
    expected = [reference.text(t, task, "passage") for t in TEXTS] + [reference.image(i, task) for i in IMAGES[:2]]
    for got, want in zip(texts + images, expected, strict=True):
        assert got.shape == want.multivector.shape
        np.testing.assert_allclose(got, want.multivector, atol=TOLERANCE)


def test_dense_and_multivector_in_one_call(client: httpx.Client, reference: Reference) -> None:
    body = {"model": "jina", "input": TEXTS[:2], "outputs": ["dense", "multivector"], "task": "code"}
    data = client.post("/v1/encode", json=body).json()["data"]
    for row, text in zip(data, TEXTS[:2], strict=True):
        want = reference.text(text, "code")
        np.testing.assert_allclose(np.array(row["dense"]), want.dense, atol=TOLERANCE)
        np.testing.assert_allclose(np.array(row["multivector"]), want.multivector, atol=TOLERANCE)


def test_uploaded_images_and_texts_share_the_request(client: httpx.Client, reference: Reference) -> None:
    files = [("file", (f"{i}.png", data, "image/png")) for i, data in enumerate(IMAGES[:2])]
    form = {"model": "jina", "input": TEXTS[0], "task": "code", "prompt_name": "passage"}
    answer = client.post("/v1/embeddings/upload", data=form, files=files)
    expected = [reference.text(TEXTS[0], "code", "passage")] + [reference.image(i, "code") for i in IMAGES[:2]]
    np.testing.assert_allclose(vectors(answer), np.stack([e.dense for e in expected]), atol=TOLERANCE)
    assert answer.json()["usage"]["prompt_tokens"] == sum(e.tokens for e in expected)


def test_one_at_a_time_equals_batched(client: httpx.Client) -> None:
    texts = embed(client, TEXTS, task="code")
    images = vectors(client.post("/v1/embeddings", json=images_body(IMAGES, task="code")))
    for i, text in enumerate(TEXTS):
        np.testing.assert_allclose(embed(client, [text], task="code")[0], texts[i], atol=1e-5)
    for i, image in enumerate(IMAGES):
        single = vectors(client.post("/v1/embeddings", json=images_body([image], task="code")))
        np.testing.assert_allclose(single[0], images[i], atol=1e-5)


def test_requests_of_different_tasks_at_once_each_get_their_own(client: httpx.Client, reference: Reference) -> None:
    burst = [task for task in TASKS for _ in range(3)]
    with ThreadPoolExecutor(len(burst)) as pool:
        answers = list(pool.map(lambda task: embed(client, TEXTS, task=task, prompt_name="passage"), burst))
    for task, got in zip(burst, answers, strict=True):
        expected = np.stack([reference.text(t, task, "passage").dense for t in TEXTS])
        np.testing.assert_allclose(got, expected, atol=TOLERANCE)


def test_dimensions_cut_and_renormalise(client: httpx.Client, reference: Reference) -> None:
    got = embed(client, TEXTS, dimensions=8, task="text-matching")
    whole = np.stack([reference.text(t, "text-matching").dense for t in TEXTS])
    np.testing.assert_allclose(got, whole[:, :8] / np.linalg.norm(whole[:, :8], axis=1, keepdims=True), atol=TOLERANCE)


def test_an_unknown_task_is_a_400_naming_the_tasks(client: httpx.Client) -> None:
    for path, body in (
        ("/v1/embeddings", {"model": "jina", "input": TEXTS, "task": "clustering"}),
        ("/v1/encode", {"model": "jina", "input": TEXTS, "task": "retrieval.query", "outputs": ["multivector"]}),
    ):
        refused = client.post(path, json=body)
        assert refused.status_code == 400, refused.text
        assert "retrieval, text-matching, code" in refused.json()["error"]["message"]


def test_the_model_says_what_it_takes(client: httpx.Client) -> None:
    listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert listed["jina"]["kind"] == "dense"
    assert {"embed_text", "embed_image", "multivector"} <= set(listed["jina"]["capabilities"])
    refused = client.post("/v1/embeddings", json={"model": "jina", "input": [[1, 2, 3]]})
    assert refused.status_code == 400, refused.text


def test_files_without_the_task_adapters_are_refused_naming_them(serve: Any, files: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(files, bare)
    (bare / "adapters" / "adapter_model.safetensors").unlink()
    live = serve({"models": [{"name": "bare", "source": str(bare)}]})
    with live.client() as opened:
        refused = opened.post("/v1/embeddings", json={"model": "bare", "input": TEXTS})
    assert refused.status_code == 503, refused.text
    message = refused.json()["error"]["message"]
    assert "task adapters" in message
    assert "adapter_model.safetensors" in message


def test_an_adapter_saved_in_the_older_module_layout_loads_the_same() -> None:
    from model_registry.adapters.jina_v4 import published_name

    assert published_name("model.layers.0.self_attn.q_proj") == "model.language_model.layers.0.self_attn.q_proj"
    assert published_name("model.language_model.layers.1.mlp.up_proj") == "model.language_model.layers.1.mlp.up_proj"
    assert published_name("visual.blocks.0.mlp.up_proj") == "model.visual.blocks.0.mlp.up_proj"
    assert published_name("multi_vector_projector") == "multi_vector_projector"


def test_cohere_s_input_type_is_the_role_and_its_prompt(client: httpx.Client, reference: Reference) -> None:
    """search_document means a passage; search_query (and no input_type) a query; retrieval runs."""
    for input_type, prompt_name in (("search_document", "passage"), ("search_query", "query"), (None, "query")):
        body: dict[str, Any] = {"model": "jina", "texts": TEXTS, "embedding_types": ["float"]}
        if input_type is not None:
            body["input_type"] = input_type
        answer = client.post("/v2/embed", json=body)
        assert answer.status_code == 200, answer.text
        got = np.array(answer.json()["embeddings"]["float"], dtype=np.float32)
        expected = np.stack([reference.text(t, "retrieval", prompt_name).dense for t in TEXTS])
        np.testing.assert_allclose(got, expected, atol=TOLERANCE)
