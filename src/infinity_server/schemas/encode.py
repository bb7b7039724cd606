"""Wire model of the native `POST /v1/encode`: any subset of dense, sparse and multi-vector output."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from infinity_server.encoding import EmbeddingType, EncodingFormat

OutputName = Literal["dense", "sparse", "multivector"]


class EncodeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: StrictStr
    input: StrictStr | Annotated[list[StrictStr], Field(min_length=1)]
    outputs: Annotated[list[OutputName], Field(min_length=1)] = ["dense"]
    # "query" encodes queries (ColBERT query augmentation, query prompts); documents otherwise.
    prompt_name: StrictStr | None = None
    truncate: StrictBool | None = None
    return_tokens: StrictBool = False
    encoding_format: EncodingFormat = "float"
    embedding_type: EmbeddingType = "float32"
    priority: StrictInt | None = Field(default=None, ge=-100, le=100)

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)
