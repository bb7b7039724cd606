"""Wire models of Infinity's `POST /rerank` and `POST /classify`.

Documents are taken as any JSON value here so that a non-string document is reported by the
engine with its index (a 400), not as a schema mismatch.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from infinity_server.schemas.common import MAX_COUNT, Body, ModelOptions, one_or_many
from model_registry import MAX_WEIGHT

Weight = StrictFloat | StrictInt | None
_WEIGHT_RANGE: dict[str, Any] = {"minimum": 0, "maximum": MAX_WEIGHT}


class RerankWeights(Body):
    """A hybrid rerank's weight per output (docs/rerank.md); an omitted one takes the model's default."""

    model_config = ConfigDict(extra="forbid", frozen=True)  # a misspelt output is an error, not a 0

    # The range is the engine's (ranking.MAX_WEIGHT), checked there with a 400 naming it.
    dense: Weight = Field(default=None, allow_inf_nan=False, json_schema_extra=_WEIGHT_RANGE)
    sparse: Weight = Field(default=None, allow_inf_nan=False, json_schema_extra=_WEIGHT_RANGE)
    multivector: Weight = Field(default=None, allow_inf_nan=False, json_schema_extra=_WEIGHT_RANGE)


class RerankRequest(ModelOptions):
    model_family = "rerank"
    query: StrictStr
    documents: list[Any]
    top_n: StrictInt | None = Field(default=None, ge=1, le=MAX_COUNT)
    return_documents: StrictBool = False
    raw_scores: StrictBool = False
    # Extension: an LLM reranker's instruction for this request (docs/rerank.md).
    instruction: StrictStr | None = None
    # Extension: models with several outputs (BGE-M3) rank by their weighted parts (docs/rerank.md).
    weights: RerankWeights | None = None
    return_parts: StrictBool = False


class ClassifyRequest(ModelOptions):
    model_family = "predict"
    input: StrictStr | list[StrictStr]
    raw_scores: StrictBool = False

    def texts(self) -> list[str]:
        return one_or_many(self.input)
