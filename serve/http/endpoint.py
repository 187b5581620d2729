"""One row of the route table, what a handler is given and gives back (`Incoming`, `Answer`), and the table itself
(`RouteTable`): the routes every model has (serve/http/routes.py) and the served task's own (its `endpoints()`,
serve/tasks/), added once it has loaded; what the router matches, the metrics know and /docs.json documents.

Who answers a row:
- HANDOFF: serve/http/router.py calls the row's handler, after the front door has read and bounded the body of a row
  that takes one (`body`);
- BENTOML: BentoML's own routes (its probes), listed so the table is whole and the document shows them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from starlette.routing import compile_path

from contract.errors import ClientError
from serve.http.front_door import BodyRoute, Receive, Scope, query_params
from serve.observability.logs import printable

HANDOFF, BENTOML = "handoff", "bentoml"
ERROR = {"$ref": "#/components/schemas/Error"}
JSON_OBJECT = {"type": "object"}
MODEL_ERRORS = (400, 404, 408, 413, 415, 429, 503)
"""what a model's route that takes a body may answer besides 200"""


def plain_error(error: ClientError) -> dict[str, Any]:
    """handoff's error body: `{"error": "what was wrong"}`."""
    return {"error": str(error)}


@dataclass(frozen=True)
class Incoming:
    """A request as a handler sees it: a body route's body already read and bounded by the front door."""

    scope: Scope
    body: bytes = b""
    params: dict[str, list[str]] = field(default_factory=dict)
    """a form's fields other than its file, or else the query string's"""
    path_params: dict[str, str] = field(default_factory=dict)
    receive: Receive | None = None
    """a body route's: after the body, it gives `http.disconnect` when the client leaves (a long answer watches it)"""

    @property
    def content_type(self) -> str:
        return self.header(b"content-type").split(";")[0].strip().lower()

    def header(self, name: bytes) -> str:
        for key, value in self.scope.get("headers") or []:
            if key == name:
                return value.decode("latin-1")
        return ""

    @property
    def query(self) -> dict[str, list[str]]:
        """The query string's parameters (a form's request has its own `params` besides)."""
        return query_params(self.scope)


@dataclass(frozen=True)
class Answer:
    """What a handler answers: a JSON document (a dict, or bytes already encoded) or another body and its type."""

    body: dict[str, Any] | bytes
    media_type: str | None = "application/json"
    """None: `headers` carry the Content-Type"""
    status: int = 200
    headers: tuple[tuple[bytes, bytes], ...] = ()
    stream: AsyncIterator[bytes] | None = None
    """a body sent as it comes (server-sent events), in place of `body`"""


Handler = Callable[[Incoming], Awaitable[Answer]]


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    """as Starlette matches it; `{name}` and `{version}` are path parameters (the protocol's model paths)"""
    summary: str
    answered_by: str
    handler: Handler | None = None
    """HANDOFF: the coroutine that answers it; BENTOML: None"""
    body: BodyRoute | None = None
    """a route that takes a body: what the front door accepts and reads for it"""
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
    error_body: Callable[[ClientError], dict[str, Any]] = plain_error
    """how its errors are written, the front door's too: `{"error": "..."}`, or another API's shape (OpenAI's)"""
    error_schema: dict[str, Any] = field(default_factory=lambda: ERROR)
    """that body's OpenAPI schema"""
    admit: Callable[[], object] | None = None
    """a served task's routes: the service's check that the model is ready and has room, before the handler runs
    (set by `RouteTable.serve`)"""


class RouteTable:
    """Every route the service answers: `common` (serve/http/routes.py) from the start, and the served task's own once
    it has loaded (`serve`). The router matches against it and the metrics ask it which paths are known; /docs.json
    documents it, so a model's document lists the routes it answers and no other."""

    def __init__(self, common: list[Endpoint], model_name: str) -> None:
        self.common = common
        self.model_name = model_name
        self.task_name: str | None = None
        self.task_rows: list[Endpoint] = []
        self.load_failure: str | None = None
        self._use(common)

    def serve(self, task_name: str, rows: list[Endpoint], admit: Callable[[], object]) -> None:
        """Adds the served task's routes, each answered only once `admit` lets it (the model ready, with room)."""
        paths = [(e.method, e.path) for e in rows]
        taken = sorted({(e.method, e.path) for e in self.common} & set(paths))
        if taken or len(set(paths)) != len(paths):
            raise ValueError(f"task {task_name}: routes declared twice or already the service's: {taken or paths}")
        self.task_name = task_name
        self.task_rows = [replace(e, admit=admit) for e in rows]
        self._use([*self.task_rows, *self.common])

    def failed(self, reason: str) -> None:
        """The model did not load: a request for any other route is answered 503 with `reason`."""
        self.load_failure = reason

    def _use(self, rows: list[Endpoint]) -> None:
        self.rows = rows
        self.match = route_matcher(rows, self.model_name)
        self.known_paths = known_paths(rows, self.model_name)

    def __contains__(self, path: object) -> bool:
        """A path the service answers for this model (each has its own /metrics series; the rest share one)."""
        return path in self.known_paths

    def unmatched(self, method: str, path: str) -> ClientError:
        """The refusal of a request no row answers: the model's not ready (503), or a 404 naming its routes."""
        if self.load_failure is not None:
            return ClientError(f"model not ready: {self.load_failure}", 503)
        asked = f"{method} {printable(path[:200])}"
        if self.task_name is None:
            return ClientError(f"no route {asked}: GET /docs.json lists them", 404)
        return ClientError(
            f"no route {asked} for this model (task {self.task_name}): it answers {self.answered()}; "
            "GET /docs.json lists every route",
            404,
        )

    def answered(self) -> str:
        """The served task's routes, in words: "POST /classify or POST /predict"."""
        return " or ".join(f"{e.method} {e.path}" for e in self.task_rows) or "the protocol's infer"

    def document(self, title: str, version: str) -> dict[str, Any]:
        return openapi_document(self.rows, title, version)


def route_matcher(endpoints: list[Endpoint], model_name: str) -> Callable[[str, str], tuple[Endpoint, dict] | None]:
    """(method, path) -> the first row that answers it and its path parameters, or None. A GET row answers HEAD too;
    a body row matches its concrete path only (this model's name and version), so a request for another model is
    not read at all. A path without parameters is one dict lookup; the rest are tried in the table's order."""
    exact: dict[tuple[str, str], Endpoint] = {}
    patterns = []
    for e in endpoints:
        methods = (e.method, "HEAD") if e.method == "GET" else (e.method,)
        path = concrete(e.path, model_name) if e.body is not None else e.path
        if "{" not in path:
            for method in methods:
                exact.setdefault((method, path), e)
        else:
            patterns.append((methods, compile_path(path)[0], e))

    def match(method: str, path: str) -> tuple[Endpoint, dict] | None:
        found = exact.get((method, path))
        if found is not None:
            return found, {}
        for methods, pattern, e in patterns:
            if method in methods and (params := pattern.match(path)):
                return e, params.groupdict()
        return None

    return match


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
                    str(s): {"description": "Error", "content": {"application/json": {"schema": e.error_schema}}}
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
