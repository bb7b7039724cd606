"""Every field of every request body the route table declares has a bound: a string or a list a
maximum length, a mapping a maximum size, a number a range. A field bounded by a limit of the
server's configuration instead (checked before any work, and priced) is named below with the limit
that holds it. A new field without either fails here."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel, TypeAdapter

from infinity_server.app import create_app
from infinity_server.routing import operations_of
from infinity_server.settings import ServerSettings, Settings
from model_registry.config import registry_config

_TEXTS = (
    "max_inputs_per_request items of max_input_chars characters each, refused before any work; priced by characters"
)
_IDS = "max_inputs_per_request lists, each cut or refused at the model's length; priced by its ids"
_SPANS = "max_chunks_per_request spans in all, counted before the body is validated"
_MEDIA = "max_inputs_per_request media, each held to media_max_bytes and the pixel and sample limits"

#: (field path pattern, kind) -> the configured limit that bounds it. Paths are `Model.field`, with
#: `[]` for a list's items and `{}` for a mapping's values.
BOUNDED_BY_CONFIG: dict[tuple[str, str], str] = {
    (r"\.(input|inputs|texts|sentences|text_1|text_2|documents|images)(\[\])*", "array"): _TEXTS,
    (
        r"\.(input|inputs|texts|text|sentences|source_sentence|text_1|text_2|query|documents|images)(\[\])*",
        "string",
    ): _TEXTS,
    (r"\.(documents)(\[\])*", "any"): _TEXTS + " (a document object's text)",
    (r"\.(input|inputs|ids)(\[\])+", "array"): _IDS,
    (r"\.(input|inputs|ids)(\[\])+", "integer"): "a token id: checked against the model's vocabulary",
    (r"\.(input|ids)", "array"): _IDS,
    (r"\.spans(\[\])*", "array"): _SPANS,
    (r"\.spans(\[\])+", "integer"): "a character offset: checked against its text",
    (r"\.instruction", "string"): "max_input_chars, checked before any work; priced with the pair",
    (r"\.texts\[\]", "any"): _TEXTS + " (a TEI rerank text)",
    (r"\.inputs\.(sentences|source_sentence)(\[\])*", "array"): _TEXTS,
    (r"\.inputs\.(sentences|source_sentence)(\[\])*", "string"): _TEXTS,
    (r"\.inputs\[\]\.content\[\]\.text", "string"): _TEXTS,
    # an input object's (or an image document's) text and image: a text and an image together
    (r"\.(input|documents)\[\]\.text", "string"): _TEXTS,
    (r"\.(input|documents)\[\]\.image", "string"): _MEDIA,
    (r"\.inputs\[\]\.content\[\]\.image_url\.url", "string"): _MEDIA,
    (r"\.file", "string"): "batch_max_file_bytes (the upload's body limit) and batch_max_requests lines",
}


_BOUNDS = ("maxLength", "maxItems", "maxProperties", "maximum", "exclusiveMaximum", "additionalProperties")


def unbounded(schema: dict[str, Any], defs: dict[str, Any], path: str) -> Iterator[tuple[str, str]]:
    """(path, kind) of every string, list, mapping or number in `schema` without a bound."""
    if "$ref" in schema:
        yield from unbounded(defs[schema["$ref"].split("/")[-1]], defs, path)
        return
    # Bounds declared beside a union (an optional field's `json_schema_extra`) hold for each option.
    beside = {k: v for k, v in schema.items() if k in _BOUNDS}
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key, []):
            yield from unbounded({**sub, **beside}, defs, path)
    kind = schema.get("type")
    if kind is None and not any(k in schema for k in ("anyOf", "oneOf", "allOf", "$ref", "const", "enum")):
        yield path, "any"
    elif kind == "string" and not {"maxLength", "enum", "const"} & schema.keys():
        yield path, "string"
    elif kind == "array":
        if "maxItems" not in schema:
            yield path, "array"
        for sub in [schema.get("items", {}), *schema.get("prefixItems", [])]:
            if sub or "prefixItems" not in schema:
                yield from unbounded(sub, defs, path + "[]")
    elif kind == "object":
        for name, sub in schema.get("properties", {}).items():
            yield from unbounded(sub, defs, f"{path}.{name}")
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            if "maxProperties" not in schema:
                yield path, "mapping"
            yield from unbounded(extra, defs, path + "{}")
    elif kind in ("integer", "number") and not {"maximum", "exclusiveMaximum"} & schema.keys():
        yield path, kind


def request_schemas() -> dict[str, dict[str, Any]]:
    settings = Settings(
        ServerSettings(), registry_config({"models": [{"name": "f", "source": "fake", "kind": "fake"}]})
    )
    found: dict[str, dict[str, Any]] = {}
    for operation in operations_of(create_app(settings).routes):
        request = operation.request
        if request is None:
            continue
        models = getattr(request, "__args__", (request,))
        for model in models:
            if isinstance(model, type) and issubclass(model, BaseModel):
                found[model.__name__] = TypeAdapter(model).json_schema()
    return found


def excused(path: str, kind: str) -> str | None:
    for (pattern, bounded_kind), reason in BOUNDED_BY_CONFIG.items():
        if kind == bounded_kind and re.fullmatch(r"\w+" + pattern, path):
            return reason
    return None


def test_every_request_field_has_a_bound_or_names_the_limit_that_holds_it() -> None:
    missing = sorted(
        f"{path} ({kind})"
        for name, schema in request_schemas().items()
        for path, kind in unbounded(schema, schema.get("$defs", {}), name)
        if excused(path, kind) is None
    )
    assert not missing, "fields with no bound:\n" + "\n".join(missing)


def test_every_excuse_still_names_a_field() -> None:
    paths = [
        (path, kind)
        for name, schema in request_schemas().items()
        for path, kind in unbounded(schema, schema.get("$defs", {}), name)
    ]
    for (pattern, kind), _ in BOUNDED_BY_CONFIG.items():
        assert any(k == kind and re.fullmatch(r"\w+" + pattern, p) for p, k in paths), (pattern, kind)


@pytest.mark.parametrize(("model", "field"), [("EmbeddingRequest", "user"), ("RerankRequest", "top_n")])
def test_removing_a_bound_fails_the_walk(model: str, field: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk sees a bound go: the same schema with that field's bound taken out is unbounded."""
    schema = request_schemas()[model]
    prop = schema["properties"][field]
    stripped = {k: v for k, v in prop.items() if k not in ("maxLength", "maximum")}
    for option in stripped.get("anyOf", []):
        option.pop("maxLength", None)
        option.pop("maximum", None)
    schema["properties"][field] = stripped
    assert any(path == f"{model}.{field}" for path, _ in unbounded(schema, schema.get("$defs", {}), model))
