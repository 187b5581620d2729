"""One row of the route table (serve/routes.py), and what the table is turned into: the front door's body routes,
handoff's Starlette routes, the paths the metrics and the API-key gate know, and the OpenAPI document.

Who answers a row:
- FRONT_DOOR: serve/front_door.py reads and bounds the body, then calls the row's handler (every POST).
- APP: handoff's Starlette app, mounted at / in BentoML's (page, /info, /metrics, /docs.json, the protocol's GETs).
- BENTOML: BentoML's own routes (its probes), listed so the table is whole and the document shows them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.routing import Route

from serve.front_door import BodyRoute

FRONT_DOOR, APP, BENTOML = "front door", "app", "bentoml"
ERROR = {"$ref": "#/components/schemas/Error"}
JSON_OBJECT = {"type": "object"}


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    """as Starlette matches it; `{name}` and `{version}` are path parameters (the protocol's model paths)"""
    summary: str
    answered_by: str
    handler: Any = None
    """FRONT_DOOR: a serve/front_door.py BodyRoute; APP: a Starlette endpoint; BENTOML: None"""
    open: bool = False
    """answered without an API key (probes, the page)"""
    request: dict[str, Any] = field(default_factory=dict)
    """the OpenAPI requestBody's `content`, by media type"""
    query: tuple[dict[str, Any], ...] = ()
    """OpenAPI query parameters"""
    answer: tuple[str, dict[str, Any]] = ("application/json", JSON_OBJECT)
    """the 200 answer's media type and schema"""
    errors: tuple[int, ...] = ()
    """the 4xx and 5xx statuses it answers with `{"error": ...}`"""
    documented: bool = True
    """False for a catch-all (the protocol's JSON 404 for any other /v2 path)"""


def body_routes(endpoints: list[Endpoint], model_name: str) -> dict[str, BodyRoute]:
    """The front door's routes, by concrete path."""
    return {concrete(e.path, model_name): e.handler for e in endpoints if e.answered_by == FRONT_DOOR}


def app_routes(endpoints: list[Endpoint]) -> list[Route]:
    """handoff's Starlette routes, one per path (its methods gathered)."""
    methods: dict[str, list[str]] = {}
    handlers: dict[str, Callable[..., Any]] = {}
    for e in endpoints:
        if e.answered_by == APP:
            methods.setdefault(e.path, []).append(e.method)
            handlers[e.path] = e.handler
    return [Route(path, handlers[path], methods=methods[path]) for path in methods]


def concrete(path: str, model_name: str, version: str = "1") -> str:
    return path.replace("{name}", model_name).replace("{version}", version)


def known_paths(endpoints: list[Endpoint], model_name: str) -> frozenset[str]:
    """Every path the service answers for this model (each has its own /metrics series; the rest share one)."""
    return frozenset(concrete(e.path, model_name) for e in endpoints if e.documented)


def open_paths(endpoints: list[Endpoint], model_name: str) -> frozenset[str]:
    return frozenset(concrete(e.path, model_name) for e in endpoints if e.open)


def openapi_document(endpoints: list[Endpoint], title: str, version: str) -> dict[str, Any]:
    """The OpenAPI 3 document of every documented row (GET /docs.json; schemathesis runs from it)."""
    paths: dict[str, dict[str, Any]] = {}
    for e in endpoints:
        if not e.documented:
            continue
        media, schema = e.answer
        operation: dict[str, Any] = {
            "summary": e.summary,
            "operationId": f"{e.method.lower()}_{e.path.strip('/').replace('/', '_').strip('{}') or 'page'}",
            "tags": [e.answered_by],
            "responses": {
                "200": {"description": "OK", "content": {media: {"schema": schema}}},
                **{
                    str(s): {"description": "Error", "content": {"application/json": {"schema": ERROR}}}
                    for s in e.errors
                },
            },
        }
        parameters = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in ("name", "version")
            if f"{{{name}}}" in e.path
        ]
        if parameters or e.query:
            operation["parameters"] = [*parameters, *e.query]
        if e.request:
            operation["requestBody"] = {"required": True, "content": e.request}
        if not e.open:
            operation["security"] = [{"bearer": []}]
        paths.setdefault(e.path, {})[e.method.lower()] = operation
    return {
        "openapi": "3.0.2",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {
            "schemas": {
                "Error": {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}
            },
            # Only where HANDOFF_API_KEYS is set; without it every route is open.
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
