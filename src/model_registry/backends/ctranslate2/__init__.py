"""The CTranslate2 engine: encoders converted once into the artifact cache and run by CTranslate2's
own BERT and XLM-R, on CPU or CUDA, int8 included. The engine itself is `engine.Ct2Engine`."""

from __future__ import annotations

from model_registry.backends.base import EngineFacts

ENGINE = EngineFacts(
    name="ctranslate2",
    title="CTranslate2",
    implementation="model_registry.backends.ctranslate2.engine:Ct2Engine",
    extra="ctranslate2",
    probe="ctranslate2",
    dtypes=frozenset({"auto", "float32", "float16", "int8_float16"}),
    quantize=frozenset({"none", "int8"}),
    kinds=frozenset({"dense", "reranker", "classifier"}),
    architectures=frozenset({"bert", "xlm-roberta", "roberta", "camembert", "distilbert"}),
    converts=True,
    # docs/backends.md, "How to pick": the figures behind each place.
    fastest={
        ("cpu/avx2", "fp32"): 1,
        ("cpu/avx512_vnni", "fp32"): 1,
        ("cpu/amx", "fp32"): None,
        ("cpu", "int8"): 1,
        ("cuda", "int8_float16"): 1,
    },
)
