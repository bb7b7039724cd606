"""sentence-transformers' module layouts: served as sentence-transformers runs them, or refused.

The models are saved by the installed sentence-transformers (6.x writes module types such as
`sentence_transformers.base.modules.dense.Dense`, where older releases wrote
`sentence_transformers.models.Dense`), so the layout is the library's own, and each vector is
compared with `SentenceTransformer.encode` on the same files.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from model_registry import Embedding, ModelUnavailable, SyncRegistry
from tests.builders.text import bert_weights, wordpiece_tokenizer

pytestmark = pytest.mark.integration

TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog again and again", "a", "alpha beta " * 40]
HIDDEN = 32  # bert_weights' hidden size


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bert_weights(tmp_path_factory.mktemp("st-bert"))


def saved(bert: Path, root: Path, *modules: Callable[[Any], Any], **options: Any) -> Path:
    """A SentenceTransformer of the Transformer at `bert` and `modules` (each made from the library's
    modules namespace), saved at `root` by the library itself."""
    import sentence_transformers.sentence_transformer.modules as library
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(1)
    made = [library.Transformer(str(bert))] + [make(library) for make in modules]
    SentenceTransformer(modules=made, device="cpu", **options).save(str(root))
    return root


def served(root: Path) -> np.ndarray:
    entry = {"name": "m", "source": str(root), "backend": "torch", "device": "cpu"}
    with SyncRegistry.from_config({"models": [entry]}) as registry:
        items = registry.embed("m", TEXTS).items
    assert all(isinstance(item, Embedding) for item in items)
    return np.stack([np.asarray(item.dense) for item in items if isinstance(item, Embedding)])


def reference(root: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    vectors: np.ndarray = SentenceTransformer(str(root), device="cpu").encode(TEXTS, convert_to_numpy=True)
    return vectors


def test_the_installed_librarys_module_names_are_read(bert: Path, tmp_path: Path) -> None:
    root = saved(
        bert,
        tmp_path / "m",
        lambda m: m.Pooling(HIDDEN, pooling_mode="cls"),
        lambda m: m.Dense(HIDDEN, 16, activation_function=torch.nn.Tanh()),
        lambda m: m.Normalize(),
    )
    types = [module["type"] for module in json.loads((root / "modules.json").read_text())]
    assert all(t.startswith("sentence_transformers.") for t in types), types
    got, expected = served(root), reference(root)
    assert got.shape == expected.shape == (len(TEXTS), 16)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_truncate_dim_cuts_the_vectors_as_saved(bert: Path, tmp_path: Path) -> None:
    root = saved(bert, tmp_path / "m", lambda m: m.Pooling(HIDDEN, pooling_mode="mean"), truncate_dim=8)
    got, expected = served(root), reference(root)
    assert got.shape == expected.shape == (len(TEXTS), 8)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_an_older_transformer_config_name_is_read(bert: Path, tmp_path: Path) -> None:
    root = saved(bert, tmp_path / "m", lambda m: m.Pooling(HIDDEN, pooling_mode="mean"))
    settings = root / "sentence_bert_config.json"
    config = json.loads(settings.read_text()) | {"max_seq_length": 16}
    (root / "sentence_xlm-roberta_config.json").write_text(json.dumps(config))
    settings.unlink()
    np.testing.assert_allclose(served(root), reference(root), atol=1e-5)  # the long text cut at 16


REFUSED: dict[str, tuple[list[Callable[[Any], Any]], str]] = {
    "normalize before dense": (
        [lambda m: m.Pooling(HIDDEN), lambda m: m.Normalize(), lambda m: m.Dense(HIDDEN, 16)],
        "Dense after Normalize",
    ),
    "a layer norm": ([lambda m: m.Pooling(HIDDEN), lambda m: m.LayerNorm(HIDDEN)], "the LayerNorm module"),
    "a dense on token states": (
        [lambda m: m.Dense(HIDDEN, HIDDEN, module_input_name="token_embeddings"), lambda m: m.Pooling(HIDDEN)],
        "a Dense module from 'token_embeddings'",
    ),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_a_pipeline_served_otherwise_is_refused_naming_the_module(bert: Path, tmp_path: Path, case: str) -> None:
    modules, named = REFUSED[case]
    root = saved(bert, tmp_path / "m", *modules)
    with pytest.raises(ModelUnavailable, match=r"modules\.json has") as refused:
        served(root)
    assert named in str(refused.value)


@pytest.mark.parametrize("value", ["maxsim", "Dot", ["cosine"]])
def test_an_unknown_similarity_function_is_refused_at_load(bert: Path, tmp_path: Path, value: object) -> None:
    """sentence-transformers would score such a model by cosine without a word; the server refuses
    it, naming the file, the value and the functions it scores by."""
    root = saved(bert, tmp_path / "m", lambda m: m.Pooling(HIDDEN, pooling_mode="mean"))
    settings = root / "config_sentence_transformers.json"
    settings.write_text(json.dumps(json.loads(settings.read_text()) | {"similarity_fn_name": value}))
    with pytest.raises(ModelUnavailable) as refused:
        served(root)
    message = str(refused.value)
    assert str(settings) in message
    assert f"similarity_fn_name {value!r}" in message
    assert "'cosine', 'dot', 'euclidean', 'manhattan'" in message


def test_a_static_embedding_pipeline_with_another_module_is_refused_naming_it(tmp_path: Path) -> None:
    """StaticEmbedding alone, or then Normalize, is served (tests/integration/zoo/test_static.py);
    a Dense after it is not."""
    import sentence_transformers.sentence_transformer.modules as library
    from sentence_transformers import SentenceTransformer

    static = library.StaticEmbedding(wordpiece_tokenizer().backend_tokenizer, embedding_dim=HIDDEN)
    modules: list[Any] = [static, library.Dense(HIDDEN, 8)]
    SentenceTransformer(modules=modules, device="cpu").save(str(tmp_path / "m"))
    entry = {"name": "m", "source": str(tmp_path / "m")}  # a static model takes no backend key
    with (
        SyncRegistry.from_config({"models": [entry]}) as registry,
        pytest.raises(ModelUnavailable, match=r"modules\.json has StaticEmbedding, Dense"),
    ):
        registry.embed("m", TEXTS)
