"""The conformance matrix: every family (`families.FAMILIES`) on every engine that serves it, and
once with no `backend` key at all, over HTTP, equal to its reference implementation on the same
weights within 1e-4 in fp32, a batch equal to its inputs asked one by one.

The engines a family runs on are read from the engine tables (a static model runs on none: its
row's cells are refusals, each checked as a start-up error), and `auto`'s choice is checked on
every device class (AVX2, AVX-512 VNNI, AMX, another CPU, CUDA), forced on this CPU: whatever
`auto` could pick for a family is an engine this matrix runs it on. docs/text-zoo.md shows the
matrix as `families.table()` renders it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_registry.backends import choice
from model_registry.detection import rules as detect_rules
from model_registry.errors import ConfigError
from model_registry.registry import Registry
from model_registry.zoo.catalogue import RECORDS
from tests.conformance.families import (
    ENGINES,
    FAMILIES,
    HOSTS,
    PICTURES,
    QUERY,
    Family,
    auto_picks,
    data_uri,
    engines,
    table,
)
from tests.conformance.references import Answer

pytestmark = pytest.mark.integration

TOLERANCE = 1e-4
BY_NAME = {f.name: f for f in FAMILIES}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Family], Path]:
    """Each family's tiny model, built once for the module."""
    root = tmp_path_factory.mktemp("families")
    done: dict[str, Path] = {}

    def build(family: Family) -> Path:
        if family.name not in done:
            done[family.name] = family.build(root / str(len(done)))
        return done[family.name]

    return build


@pytest.fixture
def engine_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("INFINITY_ENGINE_CACHE", str(tmp_path / "engines"))
    return tmp_path / "engines"


def post(client: Any, path: str, body: dict[str, Any]) -> Any:
    answer = client.post(path, json=body)
    assert answer.status_code == 200, f"{path} {body.get('model')}: {answer.text}"
    return answer.json()


def encoded(client: Any, model: str, inputs: list[str], output: str, **extra: Any) -> list[Any]:
    body = {"model": model, "input": inputs, "outputs": [output], **extra}
    return [row[output] for row in post(client, "/v1/encode", body)["data"]]


def sparse(entry: dict[str, Any]) -> dict[int, float]:
    return dict(zip(entry["indices"], entry["values"], strict=True))


def ask(client: Any, model: str, family: Family, texts: list[str], pictures: list[bytes] = PICTURES) -> list[Answer]:
    """The family's questions, in the order its reference answers them."""
    probe = family.probe
    if probe == "dense":
        answers: list[Answer] = [np.asarray(encoded(client, model, texts, "dense"))]
        if family.queries:
            answers.append(np.asarray(encoded(client, model, texts, "dense", prompt_name="query")))
        return answers
    if probe == "rerank":
        results = post(client, "/rerank", {"model": model, "query": QUERY, "documents": texts})["results"]
        return [np.asarray([r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])])]
    if probe == "classify":
        rows = post(client, "/classify", {"model": model, "input": texts})["data"]
        return [{r["label"]: r["score"] for r in row} for row in rows]
    if probe == "sparse":
        answers = [sparse(e) for e in encoded(client, model, texts, "sparse")]
        if family.queries:
            answers += [sparse(e) for e in encoded(client, model, texts, "sparse", prompt_name="query")]
        return answers
    if probe == "multivector":
        documents: list[Answer] = [np.asarray(m) for m in encoded(client, model, texts, "multivector")]
        return documents + [np.asarray(m) for m in encoded(client, model, texts, "multivector", prompt_name="query")]
    if probe == "multi_output":
        body = {"model": model, "input": texts, "outputs": ["dense", "sparse", "multivector"]}
        rows = post(client, "/v1/encode", body)["data"]
        return [a for r in rows for a in (np.asarray(r["dense"]), sparse(r["sparse"]), np.asarray(r["multivector"]))]
    assert probe == "image_text"
    images = [data_uri(p) for p in pictures]
    return [
        np.asarray(encoded(client, model, texts, "dense")),
        np.asarray(encoded(client, model, images, "dense", modality="image")),
    ]


def one_by_one(client: Any, model: str, family: Family, texts: list[str]) -> list[Answer]:
    """The questions with each input asked alone, regrouped in the order of the batch's answers."""
    if family.probe == "image_text":
        alone = [ask(client, model, family, [t], [p]) for t, p in zip(texts, PICTURES + PICTURES, strict=False)]
        return [np.concatenate([a[0] for a in alone]), np.concatenate([a[1] for a in alone[: len(PICTURES)]])]
    alone = [ask(client, model, family, [t]) for t in texts]
    if family.probe == "multi_output":  # each text's three answers in turn, as the batch gives them
        return [answer for answers in alone for answer in answers]
    if family.probe in ("sparse", "multivector", "classify"):  # an answer per text: the documents', then the queries'
        return [answers[i] for i in range(len(alone[0])) for answers in alone]
    return [np.concatenate([np.asarray(answers[i]) for answers in alone]) for i in range(len(alone[0]))]


def difference(got: Answer, want: Answer) -> float:
    """The largest absolute difference (a sparse mapping: over the union of its terms)."""
    if isinstance(want, dict) or isinstance(got, dict):
        assert isinstance(got, dict)
        assert isinstance(want, dict)
        return max((abs(got.get(k, 0.0) - want.get(k, 0.0)) for k in got.keys() | want.keys()), default=0.0)
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return float(np.abs(got - want).max(initial=0.0)) if got.shape == want.shape else float("inf")


def decided_rules(directory: Path, family: Family, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, set[str]]:
    """The family's layout as detection reads it, and the names of the rules that decided it."""
    from model_registry.config import ModelSpec
    from model_registry.detection.layout import detect

    decided: set[str] = set()
    first = detect_rules.first

    def recording(*args: Any, **kwargs: Any) -> Any:
        rule = first(*args, **kwargs)
        if rule is not None:
            decided.add(rule.name)
        return rule

    monkeypatch.setattr(detect_rules, "first", recording)
    layout = detect(directory, ModelSpec.model_validate({"name": "m", "source": str(directory), **family.entry}))
    monkeypatch.setattr(detect_rules, "first", first)
    return layout, decided


@pytest.mark.parametrize("name", list(BY_NAME))
def test_each_family_answers_as_its_reference_on_every_engine_and_with_no_backend_key(
    serve: Any, built: Callable[[Family], Path], engine_cache: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    family = BY_NAME[name]
    directory = built(family)
    layout, decided = decided_rules(directory, family, monkeypatch)
    assert (layout.kind.value, layout.model_type) == (family.kind, family.architecture)
    assert decided == set(family.rules), f"{name}: decided by {sorted(decided)}"
    texts = list(family.texts)
    expected = family.reference(directory, texts, family.queries)
    cells = [*engines(family), "auto"]
    entries = [
        {"name": cell, "source": str(directory), **family.entry, **({} if cell == "auto" else {"backend": cell})}
        for cell in cells
    ]
    live = serve({"models": entries})
    failures = []
    with live.client() as client:
        for cell in cells:
            batched = ask(client, cell, family, texts)
            single = one_by_one(client, cell, family, texts)
            assert len(batched) == len(expected) == len(single), f"{name} on {cell}: {len(batched)} answers"
            worst = max(difference(g, w) for g, w in zip(batched, expected, strict=True))
            apart = max(difference(s, g) for s, g in zip(single, batched, strict=True))
            if worst > TOLERANCE or apart > TOLERANCE:
                failures.append(f"{cell}: {worst:.2e} from the reference, {apart:.2e} batched from single")
        served = client.get("/v1/models/auto").json()["backend"]
    assert not failures, f"{name}: " + "; ".join(failures)
    if not family.engineless:
        assert served in engines(family), f"{name}: no backend key runs it on {served}"
        return
    assert served == "numpy", f"{name}: no backend key runs it on {served}"
    for engine in ENGINES:  # the table's "no" in each engine's column
        entry = {"name": "m", "source": str(directory), **family.entry, "backend": engine}
        with pytest.raises(ConfigError, match="without an engine"):
            Registry.from_config({"models": [entry]})


@pytest.mark.parametrize("host", list(HOSTS))
def test_auto_picks_an_engine_the_matrix_runs_on_every_device_class(host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The table's `auto` columns are what `choice.choices` takes with every engine installed, and
    each is an engine the family is run on above (CUDA's float16 engines run in fp32 here)."""
    monkeypatch.setattr(choice, "available", lambda engine, where: True)
    device = "cuda" if host == "cuda" else "cpu"
    for family in FAMILIES:
        picked = auto_picks(family, host)
        if family.engineless:  # its adapter never asks `choices`
            assert picked == "numpy", f"{family.name} on {host}: auto picks {picked}"
            continue
        assert picked in engines(family), f"{family.name} on {host}: auto picks {picked}"
        if not family.llm_reranker and family.torch_only is None:
            chosen = choice.choices("m", "auto", "none", family.kind, family.config, device, host=host)
            assert chosen[0].backend == picked, f"{family.name} on {host}"
            assert chosen[-1].backend == "torch", f"{family.name} on {host}: torch is not the last resort"


def test_every_catalogue_record_and_every_rule_that_serves_has_a_family() -> None:
    examples = {e for f in FAMILIES for e in f.examples}
    assert not set(RECORDS) - examples, "catalogue records without a family in the matrix"
    serving = {r.name for r in detect_rules.all_rules() if r.refusal is None}
    assert not serving - {r for f in FAMILIES for r in f.rules}, "detection rules no family of the matrix takes"


def test_the_zoo_page_shows_the_matrix_as_the_list_says() -> None:
    page = (Path(__file__).parents[2] / "docs" / "text-zoo.md").read_text(encoding="utf-8")
    assert table() in page, f"docs/text-zoo.md should hold the matrix:\n{table()}"


def test_every_engine_serves_some_family() -> None:
    assert {e for f in FAMILIES for e in engines(f)} == set(ENGINES)
