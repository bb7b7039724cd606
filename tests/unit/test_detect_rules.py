"""Each detection rule on a tiny directory it matches and one it must not; the zoo page's table.

The directories hold only the files detection reads (config.json, modules.json, marker files):
no weights, so each case takes milliseconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from model_registry.config import ModelSpec
from model_registry.detection import rules
from model_registry.detection.layout import read_facts
from model_registry.errors import ModelUnavailable
from model_registry.types import Kind

BERT = {"model_type": "bert", "architectures": ["BertModel"]}
QWEN3_LM = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
T5_LM = {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "is_encoder_decoder": True}
TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
POOLED = {"modules.json": [TRANSFORMER, POOLING], "1_Pooling/config.json": {"pooling_mode_cls_token": True}}
PAIR_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'query' %}Q{% elif m.role == 'document' %}D{% endif %}{% endfor %}"
)


#: jina-embeddings-v3 as published: XLM-R naming its LoRA model class, with task adapters.
JINA = {
    "model_type": "xlm-roberta",
    "architectures": ["XLMRobertaLoRA"],
    "auto_map": {"AutoModel": "jinaai/xlm-roberta-flash-implementation--modeling_lora.XLMRobertaLoRA"},
    "lora_adaptations": ["retrieval.query", "text-matching"],
}

#: A `-hf` conversion of it, in transformers' own jina_embeddings_v3 layout.
JINA_HF = {"model_type": "jina_embeddings_v3", "architectures": ["JinaEmbeddingsV3Model"]}


#: model2vec's config.json, and the modules.json it writes for sentence-transformers.
MODEL2VEC = {"model_type": "model2vec", "architectures": ["StaticModel"], "normalize": True}
STATIC = {"idx": 0, "name": "0", "path": ".", "type": "sentence_transformers.models.StaticEmbedding"}
SPARSE_STATIC = "sentence_transformers.sparse_encoder.models.SparseStaticEmbedding"

#: Qwen3-VL-Embedding's config.json, as far as detection reads it.
QWEN3_VL = {"model_type": "qwen3_vl", "architectures": ["Qwen3VLForConditionalGeneration"], "vision_config": {}}
#: GME's (a Qwen2-VL chat model's config), and the reference code published beside its weights.
QWEN2_VL = {**QWEN3_VL, "model_type": "qwen2_vl", "architectures": ["Qwen2VLForConditionalGeneration"]}
GME_CODE = {"gme_inference.py": "# the GME reference code\n"}
#: Qwen2.5-VL's, which no family serves.
QWEN2_5_VL = {**QWEN3_VL, "model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"]}
#: jina-embeddings-v4's: Qwen2.5-VL naming its own class and code, with its task adapters beside it.
JINA_V4 = {
    **QWEN2_5_VL,
    "architectures": ["JinaEmbeddingsV4Model"],
    "auto_map": {"AutoModel": "modeling_jina_embeddings_v4.JinaEmbeddingsV4Model"},
    "task_names": ["retrieval", "text-matching", "code"],
}
JINA_V4_ADAPTERS = {"adapters/adapter_config.json": {"peft_type": "LORA"}, "adapters/adapter_model.safetensors": ""}
#: nomic-embed-multimodal as published: a PEFT adapter of Qwen2.5-VL alone, with BiQwen2.5's processor files.
QWEN2_5_VL_ADAPTER = {"peft_type": "LORA", "base_model_name_or_path": "Qwen/Qwen2.5-VL-3B-Instruct"}
NOMIC = {
    "adapter_config.json": QWEN2_5_VL_ADAPTER,
    "preprocessor_config.json": {"processor_class": "BiQwen2_5_Processor"},
}
#: colnomic-embed-multimodal's: the same, with ColQwen2.5's processor.
COLNOMIC = {**NOMIC, "preprocessor_config.json": {"processor_class": "ColQwen2_5_Processor"}}


def labels(count: int) -> dict[str, Any]:
    names = {str(i): f"LABEL_{i}" for i in range(count)}
    return {"model_type": "bert", "architectures": ["BertForSequenceClassification"], "id2label": names}


def remote(reference: str = "modeling_x.XModel") -> dict[str, Any]:
    return {**BERT, "architectures": ["XModel"], "auto_map": {"AutoModel": reference}}


@dataclass(frozen=True)
class Case:
    """A directory's files (path -> JSON, or text) and the entry's settings."""

    files: dict[str, Any]
    spec: dict[str, Any] = field(default_factory=dict)
    offline: bool = False


#: rule name -> (a directory it matches, one it must not match; None for the catch-all).
CASES: dict[str, tuple[Case, Case | None]] = {
    "open-clip": (
        Case({"open_clip_config.json": {"model_cfg": {}}}),
        Case({"open_clip_config.json": {"model_cfg": {}}, "config.json": BERT}),
    ),
    "static-not-dense": (
        Case({"config.json": MODEL2VEC}, {"kind": "sparse"}),
        Case({"modules.json": [STATIC]}, {"kind": "dense"}),
    ),
    "model2vec": (
        Case({"config.json": MODEL2VEC, "modules.json": [STATIC]}),
        Case({"config.json": BERT, "modules.json": [TRANSFORMER]}),
    ),
    "static-embedding": (
        Case({"modules.json": [{**STATIC, "path": "0_StaticEmbedding"}]}),
        Case({"modules.json": [{**STATIC, "type": SPARSE_STATIC}]}),
    ),
    "sparse-static-not-sparse": (
        Case({"modules.json": [{**STATIC, "type": SPARSE_STATIC}]}, {"kind": "dense"}),
        Case({"modules.json": [{**STATIC, "type": SPARSE_STATIC}]}, {"kind": "sparse"}),
    ),
    "sparse-static": (
        Case({"modules.json": [{**STATIC, "type": SPARSE_STATIC}]}),
        Case({"modules.json": [STATIC]}),
    ),
    "bi-qwen2.5-not-dense": (Case(NOMIC, {"kind": "reranker"}), Case(NOMIC, {"kind": "dense"})),
    "nomic-multimodal-adapter": (Case(NOMIC), Case(COLNOMIC, {"kind": "dense"})),
    "base-model-unused": (
        Case({"config.json": BERT}, {"base_model": "/models/base"}),
        Case(NOMIC, {"base_model": "/models/base"}),
    ),
    "peft-adapter-only": (
        Case({"adapter_config.json": {"peft_type": "LORA", "base_model_name_or_path": "vidore/colqwen2.5-base"}}),
        Case({"adapter_config.json": {"peft_type": "LORA"}, "config.json": BERT}),
    ),
    "no-config": (Case({"tokenizer.json": {}}), Case({"config.json": BERT})),
    "adapters-elsewhere": (
        Case({"config.json": BERT}, {"kind": "sparse", "adapters": {"legal": "/adapters/legal"}}),
        Case({"config.json": BERT}, {"adapters": {"legal": "/adapters/legal"}}),
    ),
    "peft-adapters": (
        Case({"config.json": BERT}, {"adapters": {"legal": "/adapters/legal"}}),
        Case({"config.json": BERT}),
    ),
    "qwen3-vl-not-embedding": (
        Case({"config.json": QWEN3_VL}),
        Case({"config.json": QWEN3_VL, **POOLED}),
    ),
    "qwen3-vl-reranker": (
        Case({"config.json": QWEN3_VL}, {"kind": "reranker"}),
        Case({"config.json": QWEN3_VL, **POOLED}, {"kind": "reranker"}),
    ),
    "qwen3-vl-reranker-keys": (
        Case({"config.json": QWEN3_VL}, {"kind": "reranker", "true_token": "Yes"}),
        Case({"config.json": QWEN3_VL}, {"kind": "reranker", "instruction": "Find pets"}),
    ),
    "qwen3-vl-embedding": (
        Case({"config.json": QWEN3_VL}, {"kind": "dense"}),
        Case({"config.json": QWEN2_5_VL}, {"kind": "dense"}),
    ),
    "qwen2-vl-not-gme": (
        Case({"config.json": QWEN2_VL}),
        Case({"config.json": QWEN2_VL, **GME_CODE}),
    ),
    "gme-own-code": (
        Case({"config.json": {**QWEN2_VL, "auto_map": {"AutoModel": "gme_inference.GmeQwen2VL"}}, **GME_CODE}),
        Case({"config.json": {**QWEN2_VL, "auto_map": {"AutoModel": "gme_inference.GmeQwen2VL"}}}),
    ),
    "gme": (
        Case({"config.json": QWEN2_VL, **GME_CODE}),
        Case({"config.json": QWEN3_VL}, {"kind": "dense"}),
    ),
    "jina-v4-own-code": (
        Case({"config.json": JINA_V4, **JINA_V4_ADAPTERS}),
        Case({"config.json": {**QWEN2_5_VL, "auto_map": JINA_V4["auto_map"]}, **JINA_V4_ADAPTERS}),
    ),
    "jina-v4-without-adapters": (
        Case({"config.json": JINA_V4, "adapters/adapter_config.json": {"peft_type": "LORA"}}),
        Case({"config.json": JINA_V4, **JINA_V4_ADAPTERS}),
    ),
    "jina-v4-not-dense": (
        Case({"config.json": JINA_V4, **JINA_V4_ADAPTERS}, {"kind": "multivector"}),
        Case({"config.json": JINA_V4, **JINA_V4_ADAPTERS}),
    ),
    "jina-v4": (
        Case({"config.json": JINA_V4, **JINA_V4_ADAPTERS}),
        Case({"config.json": QWEN2_5_VL, **JINA_V4_ADAPTERS}, {"kind": "dense"}),
    ),
    "vision-language": (
        Case({"config.json": QWEN2_5_VL, **POOLED}, {"kind": "dense"}),
        Case({"config.json": {**QWEN3_VL, "model_type": "siglip", "architectures": ["SiglipModel"]}}),
    ),
    "jina-hf-adapters": (
        Case({"config.json": JINA_HF, "retrieval.query/adapter_config.json": {"peft_type": "LORA"}}),
        Case({"config.json": JINA_HF, "1_Pooling/config.json": {"pooling_mode_mean_tokens": True}}),
    ),
    "native-port": (
        Case({"config.json": {"model_type": "nomic_bert", "architectures": ["NomicBertModel"], "auto_map": {}}}),
        Case({"config.json": {**remote("org/new-impl--modeling.NewForSequenceClassification"), "model_type": "new"}}),
    ),
    "jina-lora-port": (
        Case({"config.json": JINA, "modules.json": [{**TRANSFORMER, "type": "custom_st.Transformer"}]}),
        Case({"config.json": {**JINA, "lora_adaptations": []}}),
    ),
    "custom-module": (
        Case({"config.json": BERT, "modules.json": [TRANSFORMER, {**POOLING, "type": "custom_st.Pooling"}]}),
        Case({"config.json": BERT, "modules.json": [{**TRANSFORMER, "type": "custom_st.Transformer"}]}),
    ),
    "remote-code-untrusted": (
        Case({"config.json": remote()}),
        Case({"config.json": remote()}, {"trust_remote_code": True}),
    ),
    "remote-code-offline": (
        Case({"config.json": remote()}, {"trust_remote_code": True}, offline=True),
        Case({"config.json": remote(), "modeling_x.py": ""}, {"trust_remote_code": True}, offline=True),
    ),
    "remote-code": (
        Case({"config.json": remote(), "modeling_x.py": ""}, {"trust_remote_code": True}),
        Case({"config.json": BERT}, {"trust_remote_code": True}),
    ),
    "bge-m3": (
        Case({"config.json": BERT, "colbert_linear.pt": "", "sparse_linear.pt": ""}),
        Case({"config.json": BERT, "colbert_linear.pt": ""}),
    ),
    "colbert-ai": (Case({"config.json": BERT, "artifact.metadata": "{}"}), Case({"config.json": BERT})),
    "pylate": (
        Case(
            {
                "config.json": BERT,
                "modules.json": [TRANSFORMER, {**POOLING, "path": "1_Dense", "type": "pylate.models.Dense.Dense"}],
                "config_sentence_transformers.json": {"query_prefix": "[Q] "},
            }
        ),
        Case({**POOLED, "config.json": BERT, "config_sentence_transformers.json": {"query_prefix": "[Q] "}}),
    ),
    "splade": (
        Case(
            {
                "config.json": BERT,
                "modules.json": [{**POOLING, "type": "sentence_transformers.sparse_encoder.models.SpladePooling"}],
            }
        ),
        Case({**POOLED, "config.json": BERT}),
    ),
    "cross-encoder": (Case({"config.json": labels(1)}), Case({"config.json": labels(3)})),
    "classifier": (Case({"config.json": labels(3)}), Case({"config.json": BERT})),
    "llm-reranker-template": (
        Case({"config.json": QWEN3_LM, "tokenizer_config.json": {"chat_template": PAIR_TEMPLATE}}),
        Case({"config.json": QWEN3_LM, "tokenizer_config.json": {"chat_template": "{{ messages }}"}}),
    ),
    "media": (
        Case({"config.json": {"model_type": "clap", "architectures": ["ClapModel"]}}),
        Case({"config.json": BERT}),
    ),
    "causal-lm-without-pooling": (Case({"config.json": QWEN3_LM}), Case({**POOLED, "config.json": QWEN3_LM})),
    "seq2seq-without-pooling": (Case({"config.json": T5_LM}), Case({**POOLED, "config.json": T5_LM})),
    "bare-masked-lm": (
        Case({"config.json": {**BERT, "architectures": ["BertForMaskedLM"]}}),
        Case({**POOLED, "config.json": {**BERT, "architectures": ["BertForMaskedLM"]}}),
    ),
    "dense": (Case({"config.json": BERT}), None),
    "rerank-keys-elsewhere": (
        Case({"config.json": labels(1)}, {"true_token": "yes"}),
        Case({"config.json": QWEN3_LM}, {"kind": "reranker", "true_token": "yes"}),
    ),
    "jina-lora-not-dense": (
        Case({"config.json": JINA}, {"kind": "sparse"}),
        Case({"config.json": JINA}),
    ),
    "jina-lora": (Case({"config.json": JINA}), Case({"config.json": remote()})),
    "siglip2-naflex": (
        Case({"config.json": {"model_type": "siglip2", "architectures": ["Siglip2Model"]}}),
        Case({"config.json": {"model_type": "siglip", "architectures": ["SiglipModel"]}}),
    ),
    "llm-reranker": (
        Case({"config.json": QWEN3_LM}, {"kind": "reranker"}),
        Case({"config.json": labels(1)}, {"kind": "reranker"}),
    ),
}
#: What each rule that decides something decides on its directory above.
DECIDES: dict[str, Kind | str | bool] = {
    "open-clip": "open_clip",
    "model2vec": "static",
    "static-embedding": "static",
    "sparse-static": "sparse_static",
    "nomic-multimodal-adapter": "nomic_multimodal",
    "native-port": False,
    "jina-lora-port": False,
    "remote-code": True,
    "bge-m3": Kind.MULTI_OUTPUT,
    "colbert-ai": Kind.MULTIVECTOR,
    "pylate": Kind.MULTIVECTOR,
    "splade": Kind.SPARSE,
    "cross-encoder": Kind.RERANKER,
    "classifier": Kind.CLASSIFIER,
    "llm-reranker-template": Kind.RERANKER,
    "media": Kind.AUDIO_TEXT,
    "dense": Kind.DENSE,
    "jina-lora": "jina_lora",
    "peft-adapters": "peft_lora",
    "siglip2-naflex": "naflex",
    "qwen3-vl-embedding": "qwen3_vl",
    "gme": "gme",
    "gme-own-code": False,
    "jina-v4": "jina_v4",
    "jina-v4-own-code": False,
    "qwen3-vl-reranker": "qwen3_vl_reranker",
    "llm-reranker": "llm_reranker",
}
RULES = {rule.name: rule for rule in rules.all_rules()}


def facts_of(case: Case, root: Path, monkeypatch: pytest.MonkeyPatch, stage: rules.Stage) -> rules.Facts:
    """The facts of `case`'s directory; for a family rule, with the kind already decided."""
    root.mkdir()
    for name, content in case.files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(content if isinstance(content, str) else json.dumps(content))
    monkeypatch.setenv("HF_HUB_CACHE", str(root.parent / "hub"))
    if case.offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    facts = read_facts(root, ModelSpec(name="m", source=str(root), **case.spec))
    if stage == "family" and facts.kind is None:
        facts = replace(facts, kind=rules.kind(facts))
    return facts


def test_every_rule_has_its_cases_and_the_stages_run_in_order() -> None:
    assert set(CASES) == set(RULES)
    order = [rules.STAGES.index(rule.stage) for rule in rules.all_rules()]
    assert order == sorted(order)
    kind_rules = [rule for rule in rules.all_rules() if rule.stage == "kind"]
    assert kind_rules[-1].name == "dense", "the kind stage ends with the rule that matches any directory"


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_rule_decides_on_the_directory_it_matches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    rule = RULES[name]
    facts = facts_of(CASES[name][0], tmp_path / name, monkeypatch, rule.stage)
    assert rule.when(facts)
    if rule.refusal is not None:
        with pytest.raises(ModelUnavailable) as refused:
            rules.first(facts, rule.stage)
        assert str(refused.value) == rule.refusal(facts)
        return
    assert rules.first(facts, rule.stage) is rule, "an earlier rule of the stage claims this directory"
    decided = {"code": rule.remote, "family": rule.family, "kind": rule.kind_of(facts) if rule.kind else None}
    assert decided.get(rule.stage, rule.family) == DECIDES[name]


@pytest.mark.parametrize("name", sorted(n for n, (_, other) in CASES.items() if other is not None))
def test_a_rule_leaves_another_directory_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    other = CASES[name][1]
    assert other is not None
    assert not RULES[name].when(facts_of(other, tmp_path / name, monkeypatch, RULES[name].stage))


def rules_table() -> str:
    """The zoo page's table of rules, as the rules themselves say it."""
    rows = [f"| {i} | `{r.name}` | {r.stage} | {r.says} |" for i, r in enumerate(rules.all_rules(), start=1)]
    return "\n".join(["| # | rule | stage | what follows |", "|---|---|---|---|", *rows])


def test_the_zoo_page_lists_every_rule_as_the_table_says() -> None:
    page = (Path(__file__).parents[2] / "docs" / "text-zoo.md").read_text(encoding="utf-8")
    assert rules_table() in page, f"docs/text-zoo.md should hold the rules table:\n{rules_table()}"
