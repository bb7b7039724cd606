"""nomic-embed-multimodal over HTTP on a tiny random model in the published layout (a PEFT adapter
directory with BiQwen2.5's processor files, its Qwen2.5-VL base apart), against colpali-engine's
recipe written out here: transformers' `Qwen2_5_VLModel` (the class colpali-engine's `BiQwen2_5`
extends) with the adapter loaded by transformers' PEFT integration and merged by PEFT, layer by
layer; the processor's tokenizer padding on the left; a text as the query "Query: " + text + one
`<|endoftext|>`; an image converted to RGB behind the visual prompt, resized by the processor as
published; the last position's hidden state, divided by its norm.

PEFT's own `PeftModel.from_pretrained(base, adapter).merge_and_unload()` is not the reference's
loader here: against transformers 5's Qwen2.5-VL it finds none of the published module names
(`model.layers.N...`, transformers 4.50's) and merges nothing, with a warning; transformers'
`load_adapter` maps them, as colpali-engine's `from_pretrained` relies on."""

from __future__ import annotations

import base64
import io
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from infinity_server import cli
from model_registry.errors import ConfigError
from model_registry.registry import Registry
from tests.builders.hub import lay_out_cache
from tests.builders.nomic_multimodal import BASE_NAME, tiny_nomic_multimodal
from tests.builders.peft import peft_quietly
from tests.conftest import LiveServer

pytestmark = pytest.mark.integration

TEXTS = ["a cat sleeps on the warm windowsill", "two dogs run through the snow", "What is the capital?"]
TOLERANCE = 1e-4
#: A `max_length` that cuts the texts here.
SHORT = 8
VISUAL_PROMPT = (
    "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe the image.<|im_end|><|endoftext|>"
)


def picture(width: int, height: int, seed: int, mode: str = "RGB", spread: int = 256) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, spread, (height, width, len(mode)), dtype=np.uint8)
    if spread < 256:  # a gradient with a little noise: large, yet small to send
        pixels += (np.arange(width)[None, :, None] * 200 // width).astype(np.uint8)
    if mode == "RGBA":
        pixels[..., 3] = np.where(np.arange(width) < width // 2, 255, 40)[None, :].astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode=mode).save(buffer, format="PNG")
    return buffer.getvalue()


#: An ordinary size, a tiny one (scaled up to the processor's least pixels), an RGBA one (its
#: alpha dropped), a wide one, and one past the most pixels (scaled down).
IMAGES = [
    picture(90, 50, 1),
    picture(20, 20, 2),
    picture(70, 60, 3, "RGBA"),
    picture(300, 40, 4),
    picture(1100, 900, 5, spread=24),
]


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


# ---- the reference --------------------------------------------------------------------------------


class Reference:
    def __init__(self, adapter: Path, base: Path) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer
        from transformers import Qwen2_5_VLModel, Qwen2VLProcessor

        self.processor = Qwen2VLProcessor.from_pretrained(str(adapter))
        self.processor.tokenizer.padding_side = "left"  # as ColQwen2_5_Processor sets it
        model = Qwen2_5_VLModel.from_pretrained(str(base))
        with peft_quietly():
            model.load_adapter(str(adapter))
        layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
        assert len(layers) == 14, "every attention and MLP projection of both layers is adapted"
        for layer in layers:
            layer.merge()
        self.model = model.eval()

    def queries(self, texts: list[str]) -> tuple[np.ndarray, list[int]]:
        """BiQwen2_5_Processor.process_queries: prefix, text, one augmentation token; one batch."""
        batch = self.processor(
            text=["Query: " + t + "<|endoftext|>" for t in texts], padding="longest", return_tensors="pt"
        )
        return self._pooled(batch)

    def images(self, images: list[bytes]) -> tuple[np.ndarray, list[int]]:
        """ColQwen2_5_Processor.process_images, in one batch. Its padding of each image's pixel rows,
        undone by BiQwen2_5's forward, is left out: the rows reach the vision tower as given."""
        from PIL import Image

        opened = [Image.open(io.BytesIO(i)).convert("RGB") for i in images]
        batch = self.processor(
            text=[VISUAL_PROMPT] * len(opened), images=opened, padding="longest", return_tensors="pt"
        )
        return self._pooled(batch)

    def _pooled(self, batch: Any) -> tuple[np.ndarray, list[int]]:
        with torch.no_grad():
            hidden = self.model(**batch, use_cache=False).last_hidden_state
        pooled = hidden[:, -1]  # the last position: the last real token, padded on the left
        pooled = pooled / pooled.norm(dim=-1, keepdim=True)
        return pooled.numpy(), [int(n) for n in batch["attention_mask"].sum(dim=1)]


# ---- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return tiny_nomic_multimodal(tmp_path_factory.mktemp("nomic"))


@pytest.fixture(scope="module")
def reference(files: dict[str, Path]) -> Reference:
    return Reference(files["adapter"], files["base"])


@pytest.fixture(scope="module")
def server(files: dict[str, Path]) -> Iterator[LiveServer]:
    from infinity_server.app import create_app
    from infinity_server.settings import ServerSettings, Settings
    from model_registry.config import registry_config
    from tests.conftest import start_server

    entry = {"name": "nomic", "source": str(files["adapter"]), "base_model": str(files["base"])}
    short = {**entry, "name": "short", "max_length": SHORT}
    config = registry_config({"models": [entry, short]})
    live = start_server(create_app(Settings(ServerSettings(access_log=False), config)))
    yield live
    live.close()


@pytest.fixture
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as opened:
        yield opened


def vectors(answer: httpx.Response) -> np.ndarray:
    assert answer.status_code == 200, answer.text
    return np.array([row["embedding"] for row in answer.json()["data"]], dtype=np.float32)


def images_body(images: list[bytes]) -> dict[str, Any]:
    return {"model": "nomic", "input": [data_uri(i) for i in images], "modality": "image"}


# ---- tests --------------------------------------------------------------------------------------


@pytest.mark.parametrize("input_type", [None, "query", "document"])
def test_texts_match_the_reference_queries(client: httpx.Client, reference: Reference, input_type: str | None) -> None:
    """colpali-engine encodes every text as a query: a text sent as a document is encoded so too."""
    body: dict[str, Any] = {"model": "nomic", "input": TEXTS}
    if input_type is not None:
        body["input_type"] = input_type
    answer = client.post("/v1/embeddings", json=body)
    expected, lengths = reference.queries(TEXTS)
    np.testing.assert_allclose(vectors(answer), expected, atol=TOLERANCE)
    assert answer.json()["usage"]["prompt_tokens"] == sum(lengths)


def test_images_by_data_uri_match_the_reference(client: httpx.Client, reference: Reference) -> None:
    answer = client.post("/v1/embeddings", json=images_body(IMAGES))
    expected, lengths = reference.images(IMAGES)
    np.testing.assert_allclose(vectors(answer), expected, atol=TOLERANCE)
    # Visual tokens count in usage: each image is its whole sequence, known before the forward pass.
    assert answer.json()["usage"]["prompt_tokens"] == sum(lengths)
    prompt = len(reference.processor.tokenizer(VISUAL_PROMPT)["input_ids"]) - 1  # one image pad among them
    visual = [n - prompt for n in lengths]
    assert visual[1] == 3136 // 28**2  # the tiny one, scaled up to the least pixels
    assert 700 < visual[-1] <= 768  # the large one, scaled down to the most


def test_uploaded_images_and_a_text_match_the_reference(client: httpx.Client, reference: Reference) -> None:
    files = [("file", (f"{i}.png", data, "image/png")) for i, data in enumerate(IMAGES[:3])]
    answer = client.post("/v1/embeddings/upload", data={"model": "nomic", "input": TEXTS[0]}, files=files)
    # Form order: the text field first, then the files; texts and images share a batch.
    text, text_lengths = reference.queries(TEXTS[:1])
    images, image_lengths = reference.images(IMAGES[:3])
    np.testing.assert_allclose(vectors(answer), np.concatenate([text, images]), atol=TOLERANCE)
    assert answer.json()["usage"]["prompt_tokens"] == sum(text_lengths) + sum(image_lengths)


def test_one_at_a_time_equals_batched(client: httpx.Client) -> None:
    texts = vectors(client.post("/v1/embeddings", json={"model": "nomic", "input": TEXTS}))
    images = vectors(client.post("/v1/embeddings", json=images_body(IMAGES)))
    for i, text in enumerate(TEXTS):
        single = vectors(client.post("/v1/embeddings", json={"model": "nomic", "input": [text]}))
        np.testing.assert_allclose(single[0], texts[i], atol=1e-5)
    for i, image in enumerate(IMAGES):
        np.testing.assert_allclose(
            vectors(client.post("/v1/embeddings", json=images_body([image])))[0], images[i], atol=1e-5
        )


def test_dimensions_cut_and_renormalise(client: httpx.Client, reference: Reference) -> None:
    answer = client.post("/v1/embeddings", json={"model": "nomic", "input": TEXTS, "dimensions": 8})
    whole, _ = reference.queries(TEXTS)
    cut = whole[:, :8] / np.linalg.norm(whole[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(vectors(answer), cut, atol=TOLERANCE)


def test_a_long_text_loses_its_end_keeping_the_prefix_and_closing_token(
    client: httpx.Client, reference: Reference
) -> None:
    answer = client.post("/v1/embeddings", json={"model": "short", "input": TEXTS[:1]})
    assert answer.json()["usage"]["prompt_tokens"] == SHORT
    tokens = reference.processor.tokenizer("Query: " + TEXTS[0] + "<|endoftext|>")["input_ids"]
    kept = reference.processor.tokenizer.decode(tokens[: SHORT - 1]).removeprefix("Query: ")
    expected, lengths = reference.queries([kept])
    assert lengths == [SHORT]
    np.testing.assert_allclose(vectors(answer), expected, atol=TOLERANCE)
    refused = client.post("/v1/embeddings", json={"model": "short", "input": TEXTS[:1], "truncate": False})
    assert refused.status_code == 400, refused.text


def test_a_text_and_an_image_together_are_refused(client: httpx.Client) -> None:
    body = {"model": "nomic", "input": [{"text": TEXTS[0], "image": data_uri(IMAGES[0])}]}
    answer = client.post("/v1/embeddings", json=body)
    assert answer.status_code == 400, answer.text
    assert "separate inputs" in answer.json()["error"]["message"]


def test_the_model_says_what_it_is(client: httpx.Client, files: dict[str, Path]) -> None:
    listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert listed["nomic"]["kind"] == "dense"
    assert {"embed_text", "embed_image"} <= set(listed["nomic"]["capabilities"])
    refused = client.post("/v1/embeddings", json={"model": "nomic", "input": [[1, 2, 3]]})
    assert refused.status_code == 400, refused.text


def test_the_base_model_is_found_in_the_hub_cache(
    serve: Any, files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reference: Reference
) -> None:
    """Without `base_model`, adapter_config.json's base_model_name_or_path is a hub id looked up
    in the local hub cache, as a `source` is."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    shutil.copytree(files["base"], lay_out_cache(tmp_path / "hub", BASE_NAME, "0123abcd"), dirs_exist_ok=True)
    live = serve({"models": [{"name": "nomic", "source": str(files["adapter"])}]})
    with live.client() as opened:
        answer = opened.post("/v1/embeddings", json={"model": "nomic", "input": TEXTS})
    expected, _ = reference.queries(TEXTS)
    np.testing.assert_allclose(vectors(answer), expected, atol=TOLERANCE)


def test_a_missing_base_model_stops_the_start(
    files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError) as refused:
        Registry.from_config({"models": [{"name": "nomic", "source": str(files["adapter"])}]})
    message = str(refused.value)
    assert "model 'nomic'" in message
    assert BASE_NAME in message
    assert "`base_model:`" in message
    absent = {"name": "nomic", "source": str(files["adapter"]), "base_model": str(tmp_path / "nowhere")}
    with pytest.raises(ConfigError, match="nowhere"):
        Registry.from_config({"models": [absent]})


def test_download_readies_the_base_model_with_the_adapter(
    files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`infinity-server download` readies what a start needs: an adapter's base model too, so that
    a pod started offline from its output does not stop for want of it."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = tmp_path / "models.yaml"
    config.write_text(f"models:\n  - {{name: nomic, source: '{files['adapter']}'}}\n")
    assert cli.main(["download", "--config", str(config)]) == 1
    failed = capsys.readouterr().out
    assert "FAILED" in failed
    assert BASE_NAME in failed
    assert "`base_model:`" in failed
    snapshot = lay_out_cache(tmp_path / "hub", BASE_NAME, "0123abcd")
    shutil.copytree(files["base"], snapshot, dirs_exist_ok=True)
    assert cli.main(["download", "--config", str(config)]) == 0
    fields = capsys.readouterr().out.strip().split("\t")
    assert fields[:3] == ["nomic", str(files["adapter"]), "local directory, nothing to fetch"]
    assert fields[-1] == f"base model {snapshot}"


def test_colqwen_adapters_stay_refused_naming_the_setting(serve: Any, tmp_path: Path) -> None:
    colqwen = tiny_nomic_multimodal(tmp_path / "colqwen", processor_class="ColQwen2_5_Processor")
    plain = {"name": "col", "source": str(colqwen["adapter"])}
    based = {"name": "based", "source": str(colqwen["adapter"]), "base_model": str(colqwen["base"])}
    live = serve({"models": [plain, based]})
    with live.client() as opened:
        refused = [opened.post("/v1/embeddings", json={"model": m, "input": TEXTS}) for m in ("col", "based")]
    for answer in refused:
        assert answer.status_code == 503, answer.text
    assert "ColQwen" in refused[0].json()["error"]["message"]
    assert "`base_model`" in refused[0].json()["error"]["message"]
    assert "ColQwen2_5_Processor" in refused[1].json()["error"]["message"]


def test_kind_dense_serves_an_adapter_of_qwen2_5_vl_whatever_its_processor_says(
    serve: Any, tmp_path: Path, reference: Reference, files: dict[str, Path]
) -> None:
    unnamed = tmp_path / "unnamed"
    shutil.copytree(files["adapter"], unnamed)
    for name in ("preprocessor_config.json", "tokenizer_config.json"):
        (unnamed / name).write_text((unnamed / name).read_text().replace("BiQwen2_5_Processor", "Qwen2_5_VLProcessor"))
    entry = {"name": "dense", "source": str(unnamed), "base_model": str(files["base"]), "kind": "dense"}
    live = serve({"models": [entry]})
    with live.client() as opened:
        answer = opened.post("/v1/embeddings", json={"model": "dense", "input": TEXTS})
    expected, _ = reference.queries(TEXTS)
    np.testing.assert_allclose(vectors(answer), expected, atol=TOLERANCE)


def test_the_result_cache_keys_the_base_models_files_wherever_they_are(files: dict[str, Path], tmp_path: Path) -> None:
    from model_registry.adapters import create_adapter
    from model_registry.cache.keys import model_identity
    from model_registry.config import ModelSpec

    copied = tmp_path / "copied"
    shutil.copytree(files["base"], copied)

    def identity(base: Path) -> str:
        spec = ModelSpec(name="nomic", source=str(files["adapter"]), base_model=str(base))
        return model_identity(spec, create_adapter(spec))

    assert identity(copied) == identity(files["base"])
    (copied / "generation_config.json").write_text("{}")
    assert identity(copied) != identity(files["base"])
