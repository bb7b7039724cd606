"""Wire model of the native `POST /v1/encode`: any subset of dense, sparse and multi-vector output."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictStr

from infinity_server.encoding import EmbeddingType, EncodingFormat
from infinity_server.schemas.common import AdapterChoice, ModelOptions, OptionalName, media_strings, one_or_many

OutputName = Literal["dense", "sparse", "multivector"]


def _dense_only() -> list[OutputName]:
    return ["dense"]


class EncodeRequest(ModelOptions, AdapterChoice):
    """Texts, or with `modality: image | audio` URLs or data URIs (ColPali pages, CLIP photos)."""

    model_config = ModelOptions.model_config | {"extra": "forbid"}

    input: StrictStr | Annotated[list[StrictStr], Field(min_length=1)]
    modality: Literal["text", "image", "audio"] = "text"
    outputs: list[OutputName] = Field(default_factory=_dense_only, min_length=1, max_length=8)
    # "query" encodes queries (ColBERT query augmentation, query prompts); documents otherwise.
    prompt_name: OptionalName = None
    return_tokens: StrictBool = False
    encoding_format: EncodingFormat = "float"
    embedding_type: EmbeddingType = "float32"

    def texts(self) -> list[str]:
        return one_or_many(self.input)

    def media_inputs(self) -> list[str]:
        return media_strings(self.input)
