"""Inputs and outputs of the engine: small frozen records, no logic.

Arrays are numpy arrays at run time; this module does not import numpy so that it stays a leaf.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    FloatArray: TypeAlias = npt.NDArray[np.float32]
    IntArray: TypeAlias = npt.NDArray[np.int64]
else:
    FloatArray = Any
    IntArray = Any


class Kind(str, enum.Enum):
    """What a model is, as detected from its files or set in the configuration."""

    DENSE = "dense"
    SPARSE = "sparse"
    MULTIVECTOR = "multivector"
    MULTI_OUTPUT = "multi_output"
    RERANKER = "reranker"
    CLASSIFIER = "classifier"
    IMAGE_TEXT = "image_text"
    AUDIO_TEXT = "audio_text"
    PAGE_TEXT = "page_text"
    FAKE = "fake"


class Capability(str, enum.Enum):
    EMBED_TEXT = "embed_text"
    EMBED_IMAGE = "embed_image"
    EMBED_AUDIO = "embed_audio"
    SPARSE = "sparse"
    MULTIVECTOR = "multivector"
    RERANK = "rerank"
    CLASSIFY = "classify"


class Output(str, enum.Enum):
    """The representations an embedding item can ask for."""

    DENSE = "dense"
    SPARSE = "sparse"
    MULTIVECTOR = "multivector"


class Similarity(str, enum.Enum):
    """How a dense embedder's vectors score against each other when it reranks: the
    `similarity_fn_name` of its sentence-transformers files, cosine where they name none."""

    COSINE = "cosine"
    DOT = "dot"
    EUCLIDEAN = "euclidean"
    MANHATTAN = "manhattan"


class Modality(str, enum.Enum):
    TEXT = "text"
    IMAGE = "image"
    AUDIO = "audio"


class ModelState(str, enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    FAILED = "failed"


# ---- inputs -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class TokenIds:
    """Token ids given by the client, used as the whole sequence (no special tokens added)."""

    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Media:
    """Encoded image or audio bytes; decoding happens off the event loop in `Adapter.prepare`."""

    modality: Modality
    data: bytes
    source: str = ""


@dataclass(frozen=True, slots=True)
class Mixed:
    """A text and an image read together as one input, by a model that takes both in one
    sequence (`Adapter.mixed_inputs`: Qwen3-VL-Embedding, GME); one vector for the pair."""

    text: str
    image: Media


Content: TypeAlias = Text | TokenIds | Media | Mixed


@dataclass(frozen=True, slots=True)
class EmbedItem:
    """One input to embed. `prompt` is the literal text put before a text input.

    `truncate_left` cuts an over-long text at its start instead of its end (the prompt and the
    special tokens are kept), for adapters whose `truncation_sides` include "left". `max_tokens`
    lowers the model's token limit for this input (special tokens and prompt included), for
    adapters with `token_caps`.
    """

    content: Content
    outputs: frozenset[Output] = frozenset({Output.DENSE})
    prompt: str = ""
    is_query: bool = False
    truncate: bool = True
    truncate_left: bool = False
    max_tokens: int | None = None
    #: Late chunking: token ranges [start, stop) of the input, each pooled to its own vector.
    spans: tuple[tuple[int, int], ...] = ()
    #: The task adapter that embeds it (`Adapter.tasks`), None for the model without one.
    task: str | None = None


@dataclass(frozen=True, slots=True)
class PairItem:
    """A (query, document) pair scored by a cross-encoder; `instruction` is the request's own
    (LLM rerankers whose prompt has one), None for the model's default. `media` is the document's
    image, for a cross-encoder that reads images (`Adapter.rerank_media`); `document` is then
    its text, empty for an image alone."""

    query: str
    document: str
    truncate: bool = True
    instruction: str | None = None
    media: Media | None = None


@dataclass(frozen=True, slots=True)
class ClassifyItem:
    """One input to classify: a text, or with `pair` a pair read as the tokenizer's text and
    text_pair (an NLI model's premise and hypothesis). `truncate_left` cuts an over-long input at
    the start of its texts instead of their end, as the tokenizer does with truncation_side left;
    the classify task cuts a single text at a word boundary itself, so it sets this for pairs."""

    text: str
    truncate: bool = True
    pair: str | None = None
    truncate_left: bool = False


Item: TypeAlias = EmbedItem | PairItem | ClassifyItem


@dataclass(frozen=True, slots=True)
class Prepared:
    """An item after `Adapter.prepare`: its cost in the batch budget and adapter-private data."""

    index: int
    cost: int
    tokens: int
    data: Any
    group: str = ""


class MediaLimits(BaseModel):
    """What one decoded input may hold, checked from its header before any pixel or sample is decoded.

    - `max_image_pixels`: width x height of an image;
    - `max_image_aspect_ratio`: its longer side over its shorter side (Qwen2-VL's own processor
      refuses a ratio past 200; no retrieval model sees more);
    - `max_media_expansion`: decoded RGB bytes per encoded byte (above `decoding.DECODE_FLOOR`), so
      a few hundred bytes of PNG cannot become a gigabyte of pixels;
    - `max_audio_seconds`: the declared duration of a clip;
    - `max_audio_samples`: channels x frames of the part that is decoded (the model's window), and
      the samples that part resamples to at the model's rate;
    - `scaled_jpeg`: a JPEG decoded at 1/2, 1/4 or 1/8 scale where the model's resize still
      shrinks it 2x or more (`decoding.jpeg_scale`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_image_pixels: int = Field(default=40_000_000, ge=1)
    max_audio_seconds: float = Field(default=600.0, gt=0)
    max_image_aspect_ratio: float = Field(default=200.0, ge=1)
    max_media_expansion: float = Field(default=256.0, ge=1)
    max_audio_samples: int = Field(default=16_000_000, ge=1)
    scaled_jpeg: bool = True


# ---- outputs ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SparseVector:
    indices: IntArray
    values: FloatArray
    tokens: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Embedding:
    dense: FloatArray | None = None
    sparse: SparseVector | None = None
    multivector: FloatArray | None = None


@dataclass(frozen=True, slots=True)
class Score:
    """A relevance score; `logit` is the model's raw output where `value` has an activation applied."""

    value: float
    logit: float | None = None


@dataclass(frozen=True, slots=True)
class Labels:
    logits: FloatArray
    names: tuple[str, ...]


Result: TypeAlias = Embedding | Score | Labels


@dataclass(frozen=True, slots=True)
class Token:
    """One token of a tokenized text: its id, its text, and its span (in characters, or in UTF-8 bytes
    where asked; None for specials)."""

    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


@dataclass(frozen=True, slots=True)
class Results:
    """What one call returns: one result per input, in input order, and the real token count."""

    items: tuple[Result, ...]
    tokens: int
    #: Each item's tokens, in input order (empty where not counted per item).
    item_tokens: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    kind: Kind
    capabilities: frozenset[Capability]
    backend: str
    device: str
    dtype: str
    state: ModelState
    pinned: bool
    max_length: int | None = None
    dimensions: int | None = None
    footprint_bytes: int | None = None
    last_used: float | None = None
    queue_depth: int = 0
    queue_tokens: int = 0  # summed cost of the items waiting (tokens, for text models)
    error: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    loading_seconds: float | None = None  # how long the load in progress has run
