"""The ONNX Runtime engine: a model exported once into the artifact cache (`build`, `export`) or
the directory's own ONNX file, run on CPU or, with onnxruntime-gpu, CUDA in float16. The engine
itself is `engine.OnnxEngine`."""

from __future__ import annotations

from model_registry.backends.base import EngineFacts

_AVX2 = ("cpu/avx2", "fp32")

ENGINE = EngineFacts(
    name="onnx",
    title="ONNX Runtime",
    implementation="model_registry.backends.onnx.engine:OnnxEngine",
    extra="onnx",
    probe="onnxruntime",
    cuda_build=("onnxruntime-gpu", "onnx-gpu"),
    dtypes=frozenset({"auto", "float32", "float16"}),
    quantize=frozenset({"none", "int8"}),
    # CLIP, CLAP and the page models stay on torch.
    kinds=frozenset({"dense", "reranker", "classifier", "sparse", "multivector", "multi_output"}),
    architectures=frozenset(
        {"bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra", "mpnet"}
        | {"modernbert", "nomic_bert", "qwen3", "gemma3_text", "jina_embeddings_v3"}
    ),
    # The decoders' and nomic's exports are embedders: their last hidden state, pooled by the adapter
    # (tests/engines/families.py covers these).
    only={
        "modernbert": frozenset({"dense", "reranker", "multivector"}),
        "nomic_bert": frozenset({"dense"}),
        "qwen3": frozenset({"dense"}),
        "gemma3_text": frozenset({"dense"}),
        # jina-embeddings-v3, its task adapters in the graph (`backends/torch/lora.py`)
        "jina_embeddings_v3": frozenset({"dense"}),
    },
    # ONNX Runtime runs float16 on CUDA, and Gemma 3's activations overflow it (EmbeddingGemma's
    # model card: float32 or bfloat16 only).
    not_on_cuda={"gemma3_text": "Gemma 3's activations overflow float16, the precision it runs on CUDA"},
    # docs/backends.md, "How to pick": the figures behind each place.
    fastest={
        ("cpu/avx2", "fp32"): None,
        ("cpu/avx512_vnni", "fp32"): 2,
        ("cpu/amx", "fp32"): None,
        ("cuda", "float16"): 1,
        ("cpu", "int8"): 2,
    },
    # Each measured with a random model of its smallest published size
    # (`benchmarks/bench_onnx_families.py`; docs/backends.md, "Per architecture").
    fastest_for={
        "modernbert": {_AVX2: None},  # 0.94x torch on short inputs, 0.88x on long ones
        "nomic_bert": {_AVX2: None},  # 0.91x, 0.85-0.88x
        "qwen3": {_AVX2: None},  # 1.01-1.06x, 0.95-1.00x: level, and an export of minutes
        "gemma3_text": {_AVX2: None},  # 1.03-1.12x, 0.98-1.03x: level within two runs' spread
        "jina_embeddings_v3": {_AVX2: None},  # its task adapters in the graph: 0.94-1.03x, 0.95-1.00x
    },
)
