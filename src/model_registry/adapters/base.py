"""The adapter contract: how one model family plugs into the engine.

An adapter is synchronous and batch-shaped; it never sees asyncio or threads. The engine calls it
in this order, each stage on a thread of its choosing:

1. `prepare(items)` once per request, in a worker pool, as soon as the request arrives: tokenize or
   decode each item, validate it and price it. Raising `InvalidInput` here fails only that request,
   before any of its items reach the queue. The cost of each item (tokens for text, patches for
   images, frames for audio) is known from here on, so the queue can pack batches against
   `max_batch_tokens` without touching the model.
2. `collate(prepared)` once per batch: pad and stack into tensors. Cheap; it runs while the
   previous batch is in `forward`.
3. `forward(batch)`: the model call, and nothing else.
4. `postprocess(batch, output)`: one result per prepared item, in the order they were collated.

Items that cannot share a forward pass (a CLIP text tower and image tower, say) carry different
`Prepared.group` values; the queue never mixes groups in one batch.

A batch costs `len(items) * max(item.cost)` for padded backends: that is what `batch_cost` returns
by default and what the queue packs against; an unpadded backend would return the sum.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from model_registry.types import Capability, Item, Kind, MediaLimits, Modality, Prepared, Result, Similarity

if TYPE_CHECKING:
    from model_registry.adapters.text import TextTokenizer


@dataclass(frozen=True, slots=True)
class LoadOptions:
    device: str
    dtype: str
    max_batch_tokens: int
    threads: int | None = None
    #: The engine that runs the forward pass (torch | onnx | ctranslate2, already chosen for
    #: 'auto'), its weight quantization (none | int8 | fp8), where converted artifacts are cached.
    backend: str = "torch"
    quantize: str = "none"
    cache_dir: str | None = None
    #: What one decoded image or clip may hold (the registry's `media` limits).
    media: MediaLimits = field(default_factory=MediaLimits)
    #: The torch engine's CUDA graphs for small batches (the model's `cuda_graphs`).
    cuda_graphs: bool | Literal["auto"] = "auto"


class Adapter(abc.ABC):
    """One model family. Subclasses set `kind` and `capabilities` and implement the stages."""

    kind: Kind
    capabilities: frozenset[Capability]
    backend: str = "torch"

    #: Longest input in tokens (None where length is not a token count).
    max_length: int | None = None
    #: Width of the dense output, when there is one.
    dimensions: int | None = None
    #: How a rerank scores the dense output: the model's declared similarity function.
    similarity: Similarity = Similarity.COSINE
    #: Named prompts (e.g. "query") and the one used when a request names none.
    prompts: Mapping[str, str] = {}
    default_prompt_name: str | None = None
    #: Task adapters a request may choose (`EmbedItem.task`), the one taken when it names none
    #: (None: the model without an adapter), and the instruction each puts before a text.
    tasks: tuple[str, ...] = ()
    default_task: str | None = None
    task_prompts: Mapping[str, str] = {}
    #: Whether a rerank request may give its own instruction (`PairItem.instruction`).
    rerank_instructions: bool = False
    #: The media a cross-encoder scores as documents (`PairItem.media`) besides text: image
    #: documents of `/v1/rerank/images` are scored as pairs when it lists images.
    rerank_media: frozenset[Modality] = frozenset()
    #: Whether one embedding input may hold a text and an image together (`Mixed`), read as one
    #: sequence; other models take each input as one text or one medium.
    mixed_inputs: bool = False
    #: Where the loaded model runs and in what precision (a torch dtype or its name); None
    #: until loaded, or where the adapter has no say (the configured values stand then).
    device: str | None = None
    dtype: Any = None
    #: Whether a request may lower the token limit of its texts (`EmbedItem.max_tokens`).
    token_caps: bool = False
    #: The ends an over-long text may be cut at ("right" keeps its start).
    truncation_sides: tuple[str, ...] = ("right",)
    #: A page model's working resolution in pixels (its processor's image size): a PDF's pages are
    #: rendered at about this many pixels each (`pages.render`); None for other models.
    page_pixels: int | None = None
    #: Whether a small request's batch may run on the caller's thread while the model is idle
    #: (`Worker.run_here`): a computation of microseconds (a table lookup), thread-safe, for which
    #: the hops to the worker's threads and back are most of an idle request's time.
    computes_inline: bool = False

    def build(self, options: LoadOptions) -> None:
        """Make the files `load` will read without touching the device: an ONNX export or a
        CTranslate2 conversion into the engine cache (nothing by default). Called once before
        `load`, on the same worker thread, outside the device's gate so that other models on the
        device keep running meanwhile."""
        return None

    @abc.abstractmethod
    def load(self, options: LoadOptions) -> None:
        """Read weights onto the device. Called once, on a worker thread."""

    @abc.abstractmethod
    def unload(self) -> None:
        """Drop every reference to weights and buffers so that memory can come back.

        The engine collects garbage and returns freed memory to the system (and CUDA's cache)
        right after, once for every adapter kind."""

    @abc.abstractmethod
    def footprint(self) -> int:
        """Bytes this model holds on its device while loaded (weights plus working memory)."""

    @abc.abstractmethod
    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        """Tokenize/decode and price every item of one request; `Prepared.index` is its position."""

    @abc.abstractmethod
    def collate(self, items: Sequence[Prepared]) -> Any:
        """Pad and stack prepared items into one backend batch."""

    @abc.abstractmethod
    def forward(self, batch: Any) -> Any:
        """Run the model on a collated batch."""

    @abc.abstractmethod
    def postprocess(self, batch: Any, output: Any) -> list[Result]:
        """One result per collated item, in collation order."""

    def on_forward_thread(self) -> None:
        """Called once on the model's forward thread after the load, before its first batch: for
        settings that belong to the thread that runs `forward` (none by default)."""
        return None

    def estimate(self, options: LoadOptions) -> int | None:
        """Bytes the model will hold once loaded with `options`, known before `load` (None when it
        cannot be told). The registry makes this much room before loading; `footprint()` after
        the load replaces it."""
        return None

    def batch_cost(self, count: int, longest: int, total: int) -> int:
        """What a batch takes from the budget: `count` items, the costliest `longest`, summing to
        `total`. Padded backends pay for the padding, hence the default."""
        return count * longest

    def text_tokenizer(self) -> TextTokenizer | None:
        """The tokenizer behind `/tokenize`, `/decode`, token caps and long-input windows (None
        where the model reads no plain text)."""
        return None

    def describe(self) -> dict[str, Any]:
        """Extra facts for `/models` (pooling, prompts, labels...)."""
        return {}
