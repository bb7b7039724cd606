"""`GET /v1/catalogue`: the known published models and what serving each right takes.

A configured model whose `source` names one of these ids gets the record's keys under its own
(see `model_registry.catalogue`); `/v1/models` says which record a model matched.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from infinity_server.api.common import json_response
from model_registry import CATALOGUE


class CatalogueRecord(BaseModel):
    """One published model id; absent fields are unknown or do not apply."""

    id: str
    kind: str
    keys: dict[str, Any] = {}
    pooling: str | None = None
    max_length: int | None = None
    prompts: dict[str, str] = {}
    template: str | None = None
    true_token: str | None = None
    false_token: str | None = None
    query_length: int | None = None
    document_length: int | None = None
    remote_code: bool = False
    fastest: dict[str, str] = {}
    note: str | None = None


class CatalogueList(BaseModel):
    object: Literal["list"]
    data: list[CatalogueRecord]


async def catalogue(request: Request) -> Response:
    return json_response({"object": "list", "data": [record.as_dict() for record in CATALOGUE.values()]})


routes = [Route("/v1/catalogue", catalogue, methods=["GET"])]
