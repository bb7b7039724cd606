"""Wire models of Infinity's `POST /rerank` and `POST /classify`.

Documents are taken as any JSON value here so that a non-string document is reported by the
engine with its index (a 400), not as a schema mismatch.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictBool, StrictInt, StrictStr

from infinity_server.schemas.common import ModelOptions, one_or_many


class RerankRequest(ModelOptions):
    query: StrictStr
    documents: list[Any]
    top_n: StrictInt | None = Field(default=None, ge=1)
    return_documents: StrictBool = False
    raw_scores: StrictBool = False
    # Extension: an LLM reranker's instruction for this request (docs/rerank.md).
    instruction: StrictStr | None = None


class ClassifyRequest(ModelOptions):
    input: StrictStr | list[StrictStr]
    raw_scores: StrictBool = False

    def texts(self) -> list[str]:
        return one_or_many(self.input)
