"""Wire models of Text Embeddings Inference's routes (TEI's own field names and defaults).

`model` is this server's addition: TEI serves one model per process, this server several; without
`model` a route uses `server.default_models[<route family>]`, or the only model when one is served.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator
from typing_extensions import NotRequired, TypedDict

from infinity_server.schemas.common import MAX_COUNT, Body, Dimensions, EngineOptions, NonEmpty, OptionalName
from infinity_server.schemas.infinity import RerankWeights
from infinity_server.schemas.openai import EmbeddingInput
from infinity_server.schemas.responses import FloatMatrix, FloatVector


class TeiOptions(EngineOptions):
    model: OptionalName = None
    truncation_direction: Literal["left", "right", "Left", "Right"] = "right"


class TeiEmbedRequest(TeiOptions):
    """`POST /embed`; `/embed_sparse` and `/embed_all` take the same body (without the dense options)."""

    inputs: EmbeddingInput
    normalize: StrictBool = True
    prompt_name: OptionalName = None
    dimensions: Dimensions = None
    # An input longer than the model's length without truncation: refused, windowed, or read whole.
    long_inputs: Literal["error", "chunk", "late"] = "error"
    # Late chunking's character spans [start, end) per input; without them, each input's sentences.
    spans: list[list[tuple[StrictInt, StrictInt]]] | None = None


PredictSequence = Annotated[list[StrictStr], Field(min_length=1, max_length=2)]
TopK = Annotated[StrictInt | None, Field(ge=1, le=MAX_COUNT)]


class PredictParameters(Body):
    """The Hugging Face Inference API's text-classification parameters (`InferenceClient` sends them)."""

    top_k: TopK = None


class TeiPredictRequest(TeiOptions):
    """One input, a text `a`, `[a]` or a pair `[a, b]`, or a batch of texts and pairs
    `[[a], [a, b], ...]`, as TEI's `PredictInput` reads them.

    `top_k` (or `parameters.top_k`, as `InferenceClient.text_classification(top_k=...)` sends it)
    keeps each text's best k labels."""

    inputs: StrictStr | PredictSequence | Annotated[list[PredictSequence], Field(min_length=1)]
    raw_scores: StrictBool = False
    top_k: TopK = None
    parameters: PredictParameters | None = None

    @field_validator("inputs", mode="before")
    @classmethod
    def _one_text_or_a_pair(cls, value: Any) -> Any:
        """A flat list of three or more strings is neither one input nor a batch (TEI refuses it too):
        said here in one line rather than as every failed branch of the union."""
        if isinstance(value, list) and len(value) > 2 and all(isinstance(v, str) for v in value):
            raise ValueError(
                f"a list of {len(value)} strings; a list of strings is one input, a text [a] or a pair "
                "[a, b]: send a batch as a list of lists, [[a], [b], [c, d], ...]"
            )
        return value

    def top_labels(self) -> int | None:
        """How many labels to keep per text (None: all)."""
        return self.top_k if self.top_k is not None else self.parameters.top_k if self.parameters else None


class TeiRerankRequest(TeiOptions):
    query: StrictStr
    texts: list[Any]
    raw_scores: StrictBool = False
    return_text: StrictBool = False
    # Extension: models with several outputs (BGE-M3) rank by their weighted parts (docs/rerank.md).
    weights: RerankWeights | None = None
    return_parts: StrictBool = False


class SimilarityInput(Body):
    model_config = ConfigDict(extra="forbid", frozen=True)
    source_sentence: NonEmpty
    sentences: Annotated[list[StrictStr], Field(min_length=1)]


class SimilarityParameters(Body):
    truncate: StrictBool | None = None
    truncation_direction: Literal["left", "right", "Left", "Right"] = "right"
    prompt_name: OptionalName = None


class TeiSimilarityRequest(EngineOptions):
    model: OptionalName = None
    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None


class TeiTokenizeRequest(Body):
    model: OptionalName = None
    inputs: StrictStr | Annotated[list[StrictStr], Field(min_length=1)]
    add_special_tokens: StrictBool = True
    prompt_name: OptionalName = None


class TeiDecodeRequest(Body):
    model: OptionalName = None
    ids: Annotated[list[StrictInt], Field(min_length=1)] | Annotated[list[list[StrictInt]], Field(min_length=1)]
    skip_special_tokens: StrictBool = True


class TeiPrediction(TypedDict):
    score: float
    label: str


class TeiRank(TypedDict):
    index: int
    score: float
    text: NotRequired[str]
    #: An extension: a hybrid rerank's score per output, with `return_parts`.
    parts: NotRequired[dict[str, float]]


class TeiSparseValue(TypedDict):
    index: int
    value: float


class TeiToken(TypedDict):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class TeiClassifierType(TypedDict):
    id2label: dict[str, str]
    label2id: dict[str, int]


class TeiEmbeddingType(TypedDict):
    pooling: str


class TeiModelType(TypedDict, total=False):
    """One key: the model's kind as TEI names it."""

    classifier: TeiClassifierType
    reranker: TeiClassifierType
    embedding: TeiEmbeddingType


class TeiInfo(TypedDict):
    """TEI's `/info`, with this server's `kind`, `capabilities` and `status`."""

    model_id: str
    model_sha: None
    model_dtype: str
    model_type: TeiModelType
    max_input_length: int | None
    served_model_name: str
    max_client_batch_size: int
    max_concurrent_requests: int
    #: The loaded model's batch budget; None before it loads (the budget depends on its device).
    max_batch_tokens: int | None
    #: This server has no limit on requests per batch, only on their tokens.
    max_batch_requests: None
    auto_truncate: bool
    tokenization_workers: int
    version: str
    sha: None
    docker_label: None
    max_body_bytes: int
    kind: str
    capabilities: list[str]
    status: str


#: The answers: TEI writes bare JSON arrays. A vector per input; a vector per token per input.
TeiEmbedResponse = list[FloatVector]
TeiSparseResponse = list[list[TeiSparseValue]]
TeiEmbedAllResponse = list[FloatMatrix]
#: Label scores of one input, or of each input of a batch.
TeiPredictResponse = list[TeiPrediction] | list[list[TeiPrediction]]
TeiTokenizeResponse = list[list[TeiToken]]
#: The body of the route that the model's kind answers (`POST /` and `POST /models/{name}`).
TeiRootRequest = TeiEmbedRequest | TeiPredictRequest | TeiSimilarityRequest
TeiRootResponse = TeiEmbedResponse | TeiSparseResponse | TeiPredictResponse | list[float]
