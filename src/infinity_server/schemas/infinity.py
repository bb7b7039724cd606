"""Wire models of Infinity's `POST /rerank` and `POST /classify`.

Documents are taken as any JSON value here so that a non-string document is reported by the
engine with its index (a 400), not as a schema mismatch.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    model: StrictStr
    query: StrictStr
    documents: list[Any]
    top_n: StrictInt | None = Field(default=None, ge=1)
    return_documents: StrictBool = False
    raw_scores: StrictBool = False
    # Extensions.
    truncate: StrictBool | None = None
    priority: StrictInt | None = Field(default=None, ge=-100, le=100)


class ClassifyRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    model: StrictStr
    input: StrictStr | list[StrictStr]
    raw_scores: StrictBool = False
    truncate: StrictBool | None = None
    priority: StrictInt | None = Field(default=None, ge=-100, le=100)

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)
