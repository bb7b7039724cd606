"""Wire models of Cohere's `POST /v1/rerank` and `POST /v2/rerank`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from model_registry.errors import InvalidInput


class CohereRerankRequest(BaseModel):
    """Documents are strings or objects with a `text` field."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    model: StrictStr
    query: StrictStr
    documents: list[Any]
    top_n: StrictInt | None = Field(default=None, ge=1)
    return_documents: StrictBool | None = None
    # Accepted for compatibility: documents are cut to the model's own limit, whatever is asked.
    max_tokens_per_doc: StrictInt | None = Field(default=None, ge=1)
    # Extensions.
    raw_scores: StrictBool = False
    truncate: StrictBool | None = None
    priority: StrictInt | None = Field(default=None, ge=-100, le=100)

    def texts(self) -> list[str]:
        """The documents as strings; anything but a string or `{text: string}` is `InvalidInput`."""
        texts = []
        for i, document in enumerate(self.documents):
            if isinstance(document, dict) and isinstance(document.get("text"), str):
                texts.append(document["text"])
            elif isinstance(document, str):
                texts.append(document)
            else:
                raise InvalidInput(
                    f"document {i} must be a string or an object with a string 'text' field", param="documents"
                )
        return texts
