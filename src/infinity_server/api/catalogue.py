"""The catalogue route: the known published models and what serving each right takes.

A configured model whose `source` names one of these ids gets the record's keys under its own
(see `model_registry.zoo.catalogue`); the model list says which record a model matched.
"""

from __future__ import annotations

from typing import Any, Literal, cast

from starlette.requests import Request
from typing_extensions import NotRequired, TypedDict

from infinity_server.routing import PLAIN_ERRORS, get
from model_registry import catalogue_listing


class CatalogueRecord(TypedDict):
    """One published model id; absent fields are unknown or do not apply."""

    id: str
    kind: str
    keys: NotRequired[dict[str, Any]]
    pooling: NotRequired[str]
    max_length: NotRequired[int]
    prompts: NotRequired[dict[str, str]]
    template: NotRequired[str]
    true_token: NotRequired[str]
    false_token: NotRequired[str]
    query_length: NotRequired[int]
    document_length: NotRequired[int]
    remote_code: NotRequired[bool]
    #: The `model_type` the server runs it as.
    architecture: str
    #: Device kind -> the engine and precision `backend: auto` takes there.
    fastest: dict[str, str]
    note: NotRequired[str]


class CatalogueList(TypedDict):
    object: Literal["list"]
    data: list[CatalogueRecord]


async def catalogue(request: Request) -> CatalogueList:
    # `as_dict` keeps the fields a record sets, named as above.
    records = [cast(CatalogueRecord, record) for record in catalogue_listing()]
    return {"object": "list", "data": records}


operations = [get("/v1/catalogue", catalogue, "Known published models and their records", errors=PLAIN_ERRORS)]
