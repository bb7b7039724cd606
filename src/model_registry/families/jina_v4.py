"""jina-embeddings-v4 (jinaai/jina-embeddings-v4): Qwen2.5-VL-3B with task LoRA adapters, texts and
images to single vectors and multi-vectors.

The published layout, as its files and code (`modeling_jina_embeddings_v4.py`,
`configuration_jina_embeddings_v4.py`, `custom_lora_module.py`) have it:

- config.json: model_type `qwen2_5_vl`, architectures `JinaEmbeddingsV4Model`, `auto_map` naming
  that code, and the keys it reads: `task_names` (retrieval, text-matching, code),
  `matryoshka_dims` (128 ... 2,048), `truncate_dim` (null), `single_vector_pool_strategy` ("mean"),
  `multi_vector_projector_dim` (128), `vision_start_token_id` and `vision_end_token_id`;
- the weights: `Qwen2_5_VLForConditionalGeneration`'s and `multi_vector_projector` (a linear layer
  from the hidden size to `multi_vector_projector_dim`, with a bias);
- `adapters/`: one PEFT LoRA adapter (`adapter_config.json`, `adapter_model.safetensors`) holding
  every task's factors (`...lora_A.<task>.weight`) on the language model's linear layers and the
  projector;
- the recipe: a text is "Query: " or "Passage: " and the text (prompt_name "query" by default;
  text-matching always "Query: "), no chat template, cut at 32,768 tokens; an image is
  "<|im_start|>user\\n<|vision_start|><|image_pad|><|vision_end|>Describe the image.<|im_end|>\\n" for
  every task, resized by the Qwen2.5-VL processor between its min and max pixels; the last hidden
  state is mean-pooled over a text's tokens or an image's vision span (`<|vision_start|>` to
  `<|vision_end|>`), L2-normalised (a `truncate_dim` cut, then normalised again); multi-vectors are
  the projector's output per token, L2-normalised, for the real tokens.

Its own code is never run: `adapters/jina_v4.py` follows it on transformers' Qwen2.5-VL. A
directory without the adapter files is refused at start (its vectors would be no task's).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model_registry.errors import ModelUnavailable
from model_registry.families.base import Facts, Family, Rule
from model_registry.types import Capability, Kind

MODEL_TYPE = "qwen2_5_vl"
ARCHITECTURE = "JinaEmbeddingsV4Model"
#: Where the task adapters lie, inside the model's directory.
ADAPTERS = "adapters"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
TASKS = ("retrieval", "text-matching", "code")
#: The task a request without one runs with (the published code's default).
DEFAULT_TASK = "retrieval"
#: The task whose texts take the query prompt whatever their role.
SYMMETRIC = "text-matching"
QUERY, PASSAGE = "Query: ", "Passage: "
#: The reference's longest text (`text_max_length`).
MAX_LENGTH = 32768


@dataclass(frozen=True)
class Settings:
    """The keys of config.json the recipe reads."""

    tasks: tuple[str, ...]
    projected: int
    matryoshka_dims: tuple[int, ...]
    truncate_dim: int | None


def is_jina_v4(facts: Facts) -> bool:
    return facts.model_type == MODEL_TYPE and ARCHITECTURE in facts.architectures


def missing_adapters(root: Path) -> list[str]:
    """The task adapter files a directory lacks."""
    return [name for name in ADAPTER_FILES if not (root / ADAPTERS / name).is_file()]


def check_config(root: Path, config: dict[str, Any]) -> Settings:
    """config.json's recipe keys, or `ModelUnavailable` naming the key whose value is not served."""
    strategy = config.get("single_vector_pool_strategy", "mean")
    if strategy != "mean":
        raise ModelUnavailable(
            f"{root}: single_vector_pool_strategy '{strategy}' is not served; jina-embeddings-v4 mean-pools"
        )
    tasks = tuple(str(t) for t in config.get("task_names") or TASKS)
    projected = config.get("multi_vector_projector_dim", 128)
    dims = tuple(config.get("matryoshka_dims") or ())
    cut = config.get("truncate_dim")
    width = (config.get("text_config") or {}).get("hidden_size") or config.get("hidden_size")
    if not isinstance(projected, int) or isinstance(projected, bool) or projected < 1:
        raise ModelUnavailable(f"{root}: multi_vector_projector_dim must be a positive integer, got {projected!r}")
    if cut is not None and (not isinstance(cut, int) or cut < 1 or (isinstance(width, int) and cut > width)):
        raise ModelUnavailable(f"{root}: truncate_dim {cut!r} is not a width between 1 and the hidden size {width}")
    return Settings(tasks, projected, tuple(int(d) for d in dims), cut)


def _without_adapters(facts: Facts) -> bool:
    return is_jina_v4(facts) and bool(missing_adapters(facts.root))


def _adapters_message(facts: Facts) -> str:
    folder = facts.root / ADAPTERS
    return (
        f"{facts.root} holds jina-embeddings-v4 without its task adapters: {folder} lacks "
        f"{' and '.join(missing_adapters(facts.root))}. Without them its vectors would be no task's; the adapters "
        "are published in the model repository's `adapters/` folder: download it with the weights into the "
        "model's `source` directory"
    )


def _kind_message(facts: Facts) -> str:
    return (
        f"{facts.root} holds jina-embeddings-v4, an embedder of texts and images (single vectors and multi-vectors): "
        f"it is served as kind dense only, not {facts.kind_name()}"
    )


FAMILY = Family(
    name="jina_v4",
    kind=Kind.DENSE,
    adapter="model_registry.adapters.jina_v4:JinaV4Adapter",
    capabilities=frozenset({Capability.EMBED_TEXT, Capability.EMBED_IMAGE, Capability.MULTIVECTOR}),
    summary="jina-embeddings-v4 (Qwen2.5-VL): texts and images, single vectors and multi-vectors, its task "
    "adapters per request",
    reference="the model's `modeling_jina_embeddings_v4.py` (`JinaEmbeddingsV4Model`: transformers' Qwen2.5-VL, "
    "its task's LoRA, mean pooling and `multi_vector_projector`)",
    architectures=frozenset({ARCHITECTURE}),
    rules=(
        Rule(
            "jina-v4-own-code",
            "code",
            lambda f: is_jina_v4(f) and bool(f.remote_classes()),
            "jina-embeddings-v4's own code (`auto_map`) is not run: `adapters/jina_v4.py` follows it",
            remote=False,
            note=lambda f: "jina-embeddings-v4's recipe in adapters/jina_v4.py (the checkpoint's own code is not run)",
            order=18,
        ),
        Rule(
            "jina-v4-without-adapters",
            "family",
            _without_adapters,
            "refused: jina-embeddings-v4 without its task adapters (`adapters/adapter_config.json` and "
            "`adapter_model.safetensors`)",
            order=17,
            refusal=_adapters_message,
        ),
        Rule(
            "jina-v4-not-dense",
            "family",
            lambda f: is_jina_v4(f) and f.kind != Kind.DENSE,
            "refused: jina-embeddings-v4 with a kind other than `dense`",
            order=18,
            refusal=_kind_message,
        ),
        Rule(
            "jina-v4",
            "family",
            is_jina_v4,
            "jina-embeddings-v4, its task adapters chosen per request (`adapters/jina_v4.py`)",
            order=19,
            family="jina_v4",
        ),
    ),
)
