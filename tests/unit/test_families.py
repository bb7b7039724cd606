"""Families declare themselves: detection, adapters and capabilities are read from the declarations,
and a family installed as one module of its own is detected and served."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from model_registry import Registry, backends, families
from model_registry.adapters import adapter_for
from model_registry.config import ModelSpec
from model_registry.detection.layout import detect
from model_registry.detection.rules import all_rules
from model_registry.errors import ConfigError
from model_registry.types import Capability, Embedding, Kind

#: The order the rules are tried in, written down: a family's declaration must not move another's.
ORDER = [
    *("open-clip", "static-not-dense", "model2vec", "static-embedding", "sparse-static-not-sparse"),
    *("sparse-static", "bi-qwen2.5-not-dense", "nomic-multimodal-adapter", "base-model-unused"),
    *("peft-adapter-only", "no-config", "qwen2-vl-not-gme", "qwen3-vl-not-embedding", "vision-language"),
    *("jina-hf-adapters", "jina-v4-own-code", "gme-own-code", "native-port", "jina-lora-port", "custom-module"),
    "remote-code-untrusted",
    *("remote-code-offline", "remote-code"),
    *("bge-m3", "colbert-ai", "pylate", "splade", "cross-encoder", "classifier", "llm-reranker-template"),
    *("media", "causal-lm-without-pooling", "seq2seq-without-pooling", "bare-masked-lm", "dense"),
    *("adapters-elsewhere", "qwen3-vl-reranker-keys", "rerank-keys-elsewhere", "jina-v4-without-adapters"),
    *("jina-v4-not-dense", "jina-v4", "jina-lora-not-dense"),
    *("jina-lora", "peft-adapters", "qwen3-vl-reranker", "siglip2-naflex", "qwen3-vl-embedding", "gme"),
    "llm-reranker",
]


def test_the_rules_run_in_the_order_written_down() -> None:
    assert [rule.name for rule in all_rules()] == ORDER


@pytest.mark.parametrize("family", [f for f in families.declared() if f.kind is not None], ids=lambda f: f.name)
def test_each_adapter_is_what_its_family_declares(family: families.Family) -> None:
    module, _, name = family.adapter.partition(":")
    adapter = getattr(importlib.import_module(module), name)
    assert (adapter.kind, adapter.capabilities) == (family.kind, family.capabilities)


def test_every_kind_has_one_default_family() -> None:
    defaults = [f.kind for f in families.declared() if f.default]
    assert sorted(k.value for k in defaults if k) == sorted(k.value for k in Kind)


TOY = '''
"""A toy family: a text's vector is its count of each letter a-z, normalised."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.errors import InvalidInput
from model_registry.families.base import Family, Rule
from model_registry.types import Capability, Embedding, EmbedItem, Item, Kind, Prepared, Result, Text


class LetterAdapter(Adapter):
    kind = Kind.DENSE
    capabilities = frozenset({Capability.EMBED_TEXT})
    backend = "numpy"
    dimensions = 26

    def __init__(self, layout: Any, trust_remote_code: bool) -> None:
        self.layout = layout

    def load(self, options: LoadOptions) -> None:
        return None

    def unload(self) -> None:
        return None

    def footprint(self) -> int:
        return 0

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        prepared = []
        for i, item in enumerate(items):
            if not isinstance(item, EmbedItem) or not isinstance(item.content, Text):
                raise InvalidInput(f"input {i}: the letters model embeds text only", param="input")
            prepared.append(Prepared(i, max(1, len(item.content.text)), len(item.content.text), item.content.text))
        return prepared

    def collate(self, items: Sequence[Prepared]) -> list[str]:
        return [str(p.data) for p in items]

    def forward(self, batch: list[str]) -> np.ndarray:
        counts = np.array([[text.lower().count(chr(97 + c)) for c in range(26)] for text in batch], np.float32)
        return counts / np.maximum(np.linalg.norm(counts, axis=1, keepdims=True), 1e-12)

    def postprocess(self, batch: list[str], output: np.ndarray) -> list[Result]:
        return [Embedding(dense=row) for row in output]


FAMILY = Family(
    name="letters",
    kind=Kind.DENSE,
    adapter="toy_letters:LetterAdapter",
    capabilities=frozenset({Capability.EMBED_TEXT}),
    summary="letter counts",
    reference="its own definition",
    engineless=True,
    engines=(),
    rules=(
        Rule("letters", "family", lambda f: f.model_type == "letters", "the letters family", family="letters"),
    ),
)
'''


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package directory on the path, with a distribution whose entry points the test writes."""
    site = tmp_path / "site"
    (site / "toy_letters-1.0.dist-info").mkdir(parents=True)
    (site / "toy_letters-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: toy-letters\nVersion: 1.0\n"
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "toy_letters", raising=False)
    families.declared.cache_clear()
    yield site
    sys.modules.pop("toy_letters", None)
    families.declared.cache_clear()


def _entry_points(site: Path, *lines: str) -> None:
    text = "\n".join(["[model_registry.families]", *lines, ""])
    (site / "toy_letters-1.0.dist-info" / "entry_points.txt").write_text(text)


async def test_a_family_installed_as_one_module_is_detected_and_served(installed: Path, tmp_path: Path) -> None:
    (installed / "toy_letters.py").write_text(textwrap.dedent(TOY))
    _entry_points(installed, "letters = toy_letters")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "letters", "architectures": ["Letters"]}))

    layout = detect(model, ModelSpec(name="toy", source=str(model)))
    assert (layout.kind, layout.family) == (Kind.DENSE, "letters")
    assert type(adapter_for(layout)).__name__ == "LetterAdapter"
    async with Registry.from_config({"models": [{"name": "toy", "source": str(model)}]}) as registry:
        (info,) = registry.infos()
        results = await registry.embed("toy", ["abba", "cab"])
    assert (info.kind, info.capabilities) == (Kind.DENSE, frozenset({Capability.EMBED_TEXT}))
    vectors = [item.dense for item in results.items if isinstance(item, Embedding) and item.dense is not None]
    assert np.allclose(vectors, [[2, 2] + [0] * 24, [1, 1, 1] + [0] * 23] / np.sqrt([[8], [3]]))


def test_a_directory_of_another_family_is_left_alone_by_it(installed: Path, tmp_path: Path) -> None:
    (installed / "toy_letters.py").write_text(textwrap.dedent(TOY))
    _entry_points(installed, "letters = toy_letters")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    assert detect(model, ModelSpec(name="m", source=str(model))).family is None


def test_a_family_entry_point_that_cannot_be_imported_is_named(installed: Path) -> None:
    _entry_points(installed, "letters = toy_letters_missing")
    with pytest.raises(ConfigError, match=r"entry point 'letters' .*toy_letters_missing.* cannot be imported"):
        families.declared()


def test_a_family_named_twice_is_refused(installed: Path) -> None:
    (installed / "toy_letters.py").write_text(textwrap.dedent(TOY).replace('"letters"', '"dense"'))
    _entry_points(installed, "letters = toy_letters")
    with pytest.raises(ConfigError, match="declared twice: dense"):
        families.declared()


def test_a_declaration_that_contradicts_itself_is_named(installed: Path) -> None:
    (installed / "toy_letters.py").write_text(textwrap.dedent(TOY).replace('family="letters"', 'family="other"'))
    _entry_points(installed, "letters = toy_letters")
    with pytest.raises(ConfigError, match=r"entry point 'letters' .*rule 'letters' claims family 'other'"):
        families.declared()


def test_a_module_without_a_family_is_named(installed: Path) -> None:
    (installed / "toy_letters.py").write_text("VALUE = 1\n")
    _entry_points(installed, "letters = toy_letters")
    with pytest.raises(ConfigError, match="declares no model family"):
        families.declared()


def test_the_engines_a_family_lists_serve_its_kind() -> None:
    for family in families.declared():
        if family.kind is None:
            continue
        serving = {e.name for e in backends.declared() if e.kinds is None or family.kind.value in e.kinds}
        assert set(family.engines) <= serving, family.name
        if family.default and not family.engineless:
            assert set(family.engines) == serving, family.name


def family_table() -> str:
    """The families page's table, as the declarations say it."""
    rows = []
    for family in families.declared():
        kind = family.kind.value + (" (default)" if family.default else "") if family.kind else "its routes'"
        can = ", ".join(sorted(c.value for c in family.capabilities)) or "its routes'"
        engines = ", ".join(family.engines) or "none (numpy)"
        rows.append(f"| `{family.name}` | {kind} | {can} | {engines} | {family.summary} |")
    return "\n".join(["| family | kind | can | engines | what |", "|---|---|---|---|---|", *rows])


def test_the_families_page_lists_every_family_as_declared() -> None:
    page = (Path(__file__).parents[2] / "docs" / "families.md").read_text(encoding="utf-8")
    assert family_table() in page, f"docs/families.md should hold the families table:\n{family_table()}"
