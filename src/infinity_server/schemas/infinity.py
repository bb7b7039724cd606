"""Wire models of Infinity's `POST /rerank` and `POST /classify`.

Documents are taken as any JSON value here so that a non-string document is reported by the
engine with its index (a 400), not as a schema mismatch.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, StrictBool, StrictInt, StrictStr

from infinity_server.schemas.common import ModelOptions, one_or_many
from infinity_server.schemas.openai import Usage


class RerankRequest(ModelOptions):
    query: StrictStr
    documents: list[Any]
    top_n: StrictInt | None = Field(default=None, ge=1)
    return_documents: StrictBool = False
    raw_scores: StrictBool = False


class RerankResult(BaseModel):
    relevance_score: float
    index: int
    document: str | None = None


class RerankResponse(BaseModel):
    object: str = "rerank"
    id: str
    created: int
    model: str
    results: list[RerankResult]
    usage: Usage
    meta: dict[str, Any] = {}


class ClassifyRequest(ModelOptions):
    input: StrictStr | list[StrictStr]
    raw_scores: StrictBool = False

    def texts(self) -> list[str]:
        return one_or_many(self.input)


class LabelScore(BaseModel):
    label: str
    score: float


class ClassifyResponse(BaseModel):
    object: str = "classify"
    id: str
    created: int
    model: str
    data: list[list[LabelScore]]
    usage: Usage
