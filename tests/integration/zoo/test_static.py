"""Static embedding models in both published layouts, over HTTP, against their own libraries.

model2vec's layout (with and without the modules.json model2vec writes, with per-token `weights` and
a `mapping`) answers as `StaticModel.encode`; sentence-transformers' StaticEmbedding (with and
without Normalize) as `SentenceTransformer.encode`. No `backend` key: they run on numpy, and an
engine asked for by name is a start-up error. The texts exercise what the libraries do differently:
model2vec drops the unknown token (`qqq` is one here) and cuts a long text at its characters and
then at `max_length` tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_registry.errors import ConfigError
from model_registry.registry import Registry
from tests.builders.hub import lay_out_cache
from tests.builders.static import tiny_model2vec, tiny_potion, tiny_static_embedding

pytestmark = pytest.mark.integration

TOLERANCE = 1e-5
#: Distinct words, so that any two of its cuts average other vectors.
LONG = "Scientists discovered a new species of frog near the warm windowsill while children played football in the park"
TEXTS = ["The cat sleeps on the warm windowsill.", "qqq hello world, qqq", LONG, "qqq"]
#: Each acceptance layout; model2vec's cut at 12 tokens, so that the long text is cut.
LAYOUTS: dict[str, Callable[[Path], Path]] = {
    "model2vec": partial(tiny_model2vec, max_length=12),
    "model2vec without modules.json": partial(tiny_model2vec, modules=False, max_length=12),
    "model2vec with weights and token_mapping": partial(tiny_model2vec, quantized=True, normalize=False, max_length=12),
    "StaticEmbedding": tiny_static_embedding,
    "StaticEmbedding with Normalize": partial(tiny_static_embedding, normalize=True),
}


def reference(directory: Path, texts: Sequence[str]) -> np.ndarray:
    """model2vec's `StaticModel.encode` for its layout, else `SentenceTransformer.encode`."""
    config = directory / "config.json"
    if config.is_file() and json.loads(config.read_text()).get("model_type") == "model2vec":
        from model2vec import StaticModel

        return np.asarray(StaticModel.from_pretrained(str(directory)).encode(list(texts)))
    from sentence_transformers import SentenceTransformer

    return np.asarray(SentenceTransformer(str(directory), device="cpu").encode(list(texts)))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("static")
    return {name: build(root / str(i)) for i, (name, build) in enumerate(LAYOUTS.items())}


def embed(client: Any, inputs: list[Any], **extra: Any) -> Any:
    answer = client.post("/v1/embeddings", json={"model": "static", "input": inputs, **extra})
    assert answer.status_code == 200, answer.text
    return answer.json()


def vectors(answer: Any) -> np.ndarray:
    return np.asarray([row["embedding"] for row in answer["data"]])


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_layout_answers_as_its_library_batched_as_single(serve: Any, built: dict[str, Path], layout: str) -> None:
    directory = built[layout]
    expected = reference(directory, TEXTS)
    live = serve({"models": [{"name": "static", "source": str(directory)}]})
    with live.client() as client:
        batched = vectors(embed(client, TEXTS))
        single = np.concatenate([vectors(embed(client, [text])) for text in TEXTS])
        described = client.get("/v1/models/static").json()
    np.testing.assert_allclose(batched, expected, atol=TOLERANCE)
    np.testing.assert_allclose(single, batched, atol=TOLERANCE)
    assert described["backend"] == "numpy"
    assert described["details"]["engine"]["backend"] == "numpy"
    assert described["dimensions"] == expected.shape[1]


def model2vec_chars(directory: Path, max_length: int = 12) -> int:
    """Where model2vec cuts a text: `max_length` times its vocabulary's median token length."""
    from tokenizers import Tokenizer

    vocabulary = Tokenizer.from_file(str(directory / "tokenizer.json")).get_vocab()
    return max_length * int(np.median([len(token) for token in vocabulary]))


@pytest.mark.parametrize(
    ("model_id", "build"),
    [
        ("minishlab/potion-base-8M", tiny_potion),
        ("sentence-transformers/static-retrieval-mrl-en-v1", tiny_static_embedding),
    ],
)
def test_a_catalogue_id_alone_serves_it_from_the_hub_cache(
    serve: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_id: str, build: Callable[[Path], Path]
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    directory = build(lay_out_cache(tmp_path / "hub", model_id, "0123abcd"))
    live = serve({"models": [{"name": "static", "source": model_id}]})
    with live.client() as client:
        got = vectors(embed(client, TEXTS))
        details = client.get("/v1/models/static").json()["details"]
    np.testing.assert_allclose(got, reference(directory, TEXTS), atol=TOLERANCE)
    assert details["catalogue"] == model_id


def test_the_texts_meet_what_model2vec_does_apart(built: dict[str, Path]) -> None:
    """A text of unknown tokens alone is the zero vector; the long text is cut at its characters
    before its first 12 tokens are kept: it is not the mean of its first 12 tokens."""
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    directory = built["model2vec"]
    expected = reference(directory, [*TEXTS, LONG[: model2vec_chars(directory)]])
    assert not expected[3].any()
    np.testing.assert_allclose(expected[2], expected[4], atol=TOLERANCE)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.no_truncation()
    first = tokenizer.encode(LONG, add_special_tokens=False).ids[:12]
    mean = load_file(directory / "model.safetensors")["embeddings"][first].mean(axis=0)
    assert not np.allclose(expected[2], mean / np.linalg.norm(mean), atol=1e-3)


@pytest.mark.parametrize("dtype", ["float16", "float64", "int8"])
def test_a_table_in_another_precision_answers_as_model2vec_does(serve: Any, tmp_path: Path, dtype: str) -> None:
    """model2vec averages in the table's precision (float32 for an int8 table, unscaled)."""
    directory = tiny_model2vec(tmp_path / "m", dtype=dtype, normalize=dtype != "int8")
    live = serve({"models": [{"name": "static", "source": str(directory)}]})
    with live.client() as client:
        got = vectors(embed(client, TEXTS))
    np.testing.assert_allclose(got, reference(directory, TEXTS), atol=TOLERANCE, rtol=1e-6)


def test_sentence_transformers_reads_model2vec_tensors_folded(serve: Any, tmp_path: Path) -> None:
    """A StaticEmbedding directory holding model2vec's tensors: one row per token,
    `embeddings[mapping[id]] * weights[id]`, averaged with the unknown token kept."""
    directory = tiny_model2vec(tmp_path / "m", quantized=True, normalize=False)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "model_type": "static"}))
    live = serve({"models": [{"name": "static", "source": str(directory)}]})
    with live.client() as client:
        got = vectors(embed(client, TEXTS))
    np.testing.assert_allclose(got, reference(directory, TEXTS), atol=TOLERANCE)


def test_dimensions_cut_and_renormalise(serve: Any, built: dict[str, Path]) -> None:
    directory = built["StaticEmbedding"]  # its vectors are not normalised: the cut is renormalised all the same
    expected = reference(directory, TEXTS[:3])[:, :6]
    live = serve({"models": [{"name": "static", "source": str(directory)}]})
    with live.client() as client:
        got = vectors(embed(client, TEXTS[:3], dimensions=6))
    np.testing.assert_allclose(got, expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=TOLERANCE)


def test_truncate_dim_cuts_as_saved(serve: Any, tmp_path: Path) -> None:
    directory = tiny_static_embedding(tmp_path / "m", normalize=True)
    settings = directory / "config_sentence_transformers.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "truncate_dim": 6}))
    expected = reference(directory, TEXTS)
    live = serve({"models": [{"name": "static", "source": str(directory)}]})
    with live.client() as client:
        got = vectors(embed(client, TEXTS))
    assert expected.shape == got.shape == (len(TEXTS), 6)
    np.testing.assert_allclose(got, expected, atol=TOLERANCE)


@pytest.mark.parametrize("layout", ["model2vec", "StaticEmbedding with Normalize"])
def test_tei_and_cohere_routes_answer_the_same_vectors(serve: Any, built: dict[str, Path], layout: str) -> None:
    directory = built[layout]
    expected = reference(directory, TEXTS[:3])
    live = serve({"models": [{"name": "static", "source": str(directory)}]})
    with live.client() as client:
        tei = client.post("/embed", json={"model": "static", "inputs": TEXTS[:3]})
        cohere = client.post("/v1/embed", json={"model": "static", "texts": TEXTS[:3]})
    assert tei.status_code == 200, tei.text
    assert cohere.status_code == 200, cohere.text
    np.testing.assert_allclose(tei.json(), expected, atol=TOLERANCE)
    np.testing.assert_allclose(cohere.json()["embeddings"], expected, atol=TOLERANCE)


def test_usage_counts_the_tokens_read(serve: Any, built: dict[str, Path]) -> None:
    """model2vec reads the tokens of its cut text, the unknown ones among them; no special tokens."""
    from tokenizers import Tokenizer

    directory = built["model2vec"]
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    short = TEXTS[:2]
    counted = sum(len(tokenizer.encode(text, add_special_tokens=False).ids) for text in short)
    cut = tokenizer.encode(LONG[: model2vec_chars(directory)], add_special_tokens=False).ids
    live = serve({"models": [{"name": "static", "source": str(directory)}]})
    with live.client() as client:
        usage = embed(client, short)["usage"]
        long = embed(client, [LONG])["usage"]
    assert usage == {"prompt_tokens": counted, "total_tokens": counted}
    assert long["prompt_tokens"] == min(12, len(cut))


def test_a_text_it_would_cut_is_refused_without_truncation(serve: Any, built: dict[str, Path]) -> None:
    live = serve({"models": [{"name": "static", "source": str(built["model2vec"])}]})
    with live.client() as client:
        refused = client.post("/v1/embeddings", json={"model": "static", "input": [TEXTS[2]], "truncate": False})
        kept = client.post("/v1/embeddings", json={"model": "static", "input": [TEXTS[0]], "truncate": False})
    assert refused.status_code == 400, refused.text
    assert "at most 12 tokens" in refused.text
    assert kept.status_code == 200, kept.text


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/tokenize", {"inputs": ["a cat"]}),
        ("/embed", {"inputs": ["a cat"], "truncation_direction": "left"}),
        ("/v1/embed", {"texts": ["a cat"], "max_tokens": 8}),
        ("/v1/embeddings", {"input": ["a cat"], "truncate": False, "long_inputs": "chunk"}),
    ],
)
def test_what_reads_a_transformers_tokenizer_is_a_400(
    serve: Any, built: dict[str, Path], path: str, body: dict[str, Any]
) -> None:
    live = serve({"models": [{"name": "static", "source": str(built["model2vec"])}]})
    with live.client() as client:
        answer = client.post(path, json={"model": "static", **body})
    assert answer.status_code == 400, answer.text


def test_a_tokenizer_that_truncates_cuts_as_sentence_transformers(serve: Any, tmp_path: Path) -> None:
    directory = tiny_static_embedding(tmp_path / "m", truncation=5)
    expected = reference(directory, TEXTS)
    live = serve({"models": [{"name": "static", "source": str(directory)}]})
    with live.client() as client:
        got = vectors(embed(client, TEXTS))
        assert client.get("/v1/models/static").json()["max_length"] == 5
    np.testing.assert_allclose(got, expected, atol=TOLERANCE)


def test_token_ids_embed_as_the_text_they_encode(serve: Any, built: dict[str, Path]) -> None:
    from tokenizers import Tokenizer

    directory = built["model2vec with weights and token_mapping"]
    ids = Tokenizer.from_file(str(directory / "tokenizer.json")).encode(TEXTS[1], add_special_tokens=False).ids
    live = serve({"models": [{"name": "static", "source": str(directory)}]})
    with live.client() as client:
        got = vectors(embed(client, [ids]))
    np.testing.assert_allclose(got, reference(directory, TEXTS[1:2]), atol=TOLERANCE)


@pytest.mark.parametrize(
    "setting",
    [{"backend": "onnx"}, {"backend": "ctranslate2"}, {"backend": "torch"}, {"quantize": "int8"}, {"device": "cuda"}],
)
def test_an_engine_setting_is_a_start_up_error(built: dict[str, Path], setting: dict[str, str]) -> None:
    entry = {"name": "static", "source": str(built["model2vec"]), **setting}
    with pytest.raises(ConfigError, match="without an engine") as refused:
        Registry.from_config({"models": [entry]})
    key, value = next(iter(setting.items()))
    assert f"{key}: {value}" in str(refused.value)


def test_an_engine_setting_is_refused_at_start_or_else_at_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A catalogue id in the hub cache is checked at start; one downloaded after the start (here:
    laid out then) refuses the setting when it loads."""
    from model_registry import ModelUnavailable, SyncRegistry

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    entry = {"name": "static", "source": "minishlab/potion-base-8M", "backend": "onnx"}
    with SyncRegistry.from_config({"models": [entry]}) as registry:
        tiny_potion(lay_out_cache(tmp_path / "hub", "minishlab/potion-base-8M", "0123abcd"))
        with pytest.raises(ModelUnavailable, match="backend: onnx does not apply to a static embedding model"):
            registry.embed("static", TEXTS)
    with pytest.raises(ConfigError, match="backend: onnx does not apply to a static embedding model"):
        Registry.from_config({"models": [entry]})


#: Serves a static model where torch cannot be imported, and says whether transformers was.
LIGHT = """
import json, sys
for name in ("torch", "sentence_transformers", "model2vec"):
    sys.modules[name] = None  # an install without them: importing one raises
from infinity_server.app import create_app
from model_registry import SyncRegistry

with SyncRegistry.from_config({"models": [{"name": "static", "source": sys.argv[1]}]}) as registry:
    items = registry.embed("static", json.loads(sys.argv[2])).items
print(json.dumps({"transformers": "transformers" in sys.modules, "vectors": [item.dense.tolist() for item in items]}))
"""


@pytest.mark.parametrize("layout", ["model2vec with weights and token_mapping", "StaticEmbedding with Normalize"])
def test_served_without_torch_nor_importing_transformers(built: dict[str, Path], layout: str) -> None:
    directory = built[layout]
    done = subprocess.run(
        [sys.executable, "-c", LIGHT, str(directory), json.dumps(TEXTS)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "halted" not in done.stderr, done.stderr[-3000:]  # no thread met a blocked import either
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert not answer["transformers"], "serving a static model imported transformers"
    np.testing.assert_allclose(answer["vectors"], reference(directory, TEXTS), atol=TOLERANCE)


async def test_an_idle_small_request_computes_on_the_event_loop_and_is_counted(
    built: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small request to an idle static model runs its lookup on the caller's thread (no hop to
    the worker's threads); a request over `INLINE_COST` goes through the queue. Both are counted as
    batches, timed, and answer the same vectors."""
    import threading

    from model_registry.adapters.static import StaticAdapter
    from model_registry.runtime.worker import INLINE_COST, BatchStats
    from model_registry.types import Embedding

    threads: list[str] = []
    forward = StaticAdapter.forward

    def recorded(self: StaticAdapter, batch: list[np.ndarray]) -> np.ndarray:
        threads.append(threading.current_thread().name)
        return forward(self, batch)

    monkeypatch.setattr(StaticAdapter, "forward", recorded)
    counted: list[BatchStats] = []
    directory = built["StaticEmbedding"]
    many = [TEXTS[0]] * (INLINE_COST // 4)
    async with Registry.from_config(
        {"models": [{"name": "s", "source": str(directory)}]}, on_batch=counted.append
    ) as r:
        await r.embed("s", TEXTS[:1])  # loads it (its warm-up batches run on the load's thread)
        threads.clear()
        counted.clear()
        small = await r.embed("s", TEXTS[:2])
        large = await r.embed("s", many)
    assert threads == [threading.current_thread().name, "s-forward"]
    assert [s.items for s in counted] == [2, len(many)]
    got = np.asarray([i.dense for i in small.items if isinstance(i, Embedding)])
    assert got.shape[0] == 2
    np.testing.assert_allclose(got, reference(directory, TEXTS[:2]), atol=TOLERANCE)
    first = large.items[0]
    assert isinstance(first, Embedding)
    np.testing.assert_allclose(np.asarray(first.dense), got[0], atol=1e-6)
