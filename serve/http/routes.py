"""The routes every model has, whatever its task: the page, /info, /metrics, /docs.json, the probes and the Open
Inference Protocol. serve/service.py builds the route table from them (`route_table`); the served task adds its
own (its `endpoints()`: /classify, /detect, /embed, /v1/chat/completions, ... in serve/tasks/) once it has loaded.

serve/http/router.py dispatches every request from the table: a row that takes a body (`body`) is read and bounded
by the front door first (serve/http/front_door.py: limits, content types, the request slots); BentoML's own probes are
listed so the table is whole. The same table gives the OpenAPI document at /docs.json, the paths with their own
/metrics series and the paths open without a key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from serve.http.endpoint import BENTOML, HANDOFF, Answer, Endpoint, Incoming, RouteTable
from serve.http.front_door import BodyRoute
from serve.http.page import PAGE, PAGE_HEADERS
from serve.observability.request_metrics import metrics_page
from serve.protocols.oip import ProtocolSurface

BINARY = {"type": "string", "format": "binary"}
PAGE_BYTES = PAGE.read_bytes()
HTML_HEADERS = tuple((name.encode(), value.encode()) for name, value in PAGE_HEADERS.items())


async def page(request: Incoming) -> Answer:
    return Answer(PAGE_BYTES, "text/html; charset=utf-8", headers=HTML_HEADERS)


def route_table(
    protocol: ProtocolSurface, describe: Callable[[], dict[str, Any]], title: str, version: str, model_name: str
) -> RouteTable:
    """The table with the routes every model has; `protocol` answers the Open Inference Protocol's rows, `describe`
    GET /info."""

    async def info(request: Incoming) -> Answer:
        return Answer(describe())

    async def docs(request: Incoming) -> Answer:
        return Answer(table.document(title, version))

    common = [
        Endpoint(
            "GET", "/", "a page to try the model in a browser", HANDOFF, page, open=True, answer=("text/html", {})
        ),
        Endpoint("GET", "/info", "what is served: the model, its signature, the runtime and device", HANDOFF, info),
        Endpoint("GET", "/metrics", "Prometheus metrics", HANDOFF, metrics_page, answer=("text/plain", {})),
        Endpoint("GET", "/docs.json", "this OpenAPI document", HANDOFF, docs),
        Endpoint("GET", "/livez", "the process is up (BentoML's probe)", BENTOML, open=True, answer=("text/plain", {})),
        Endpoint(
            "GET",
            "/readyz",
            "the model is loaded (BentoML's probe; 503 until then)",
            BENTOML,
            open=True,
            answer=("text/plain", {}),
        ),
        Endpoint("GET", "/healthz", "as /livez (BentoML's)", BENTOML, answer=("text/plain", {})),
        Endpoint("GET", "/v2", "the protocol's server metadata", HANDOFF, protocol.server_metadata),
        Endpoint("GET", "/v2/health/live", "the protocol's liveness", HANDOFF, protocol.live, open=True),
        Endpoint(
            "GET",
            "/v2/health/ready",
            "the protocol's readiness (503 until ready)",
            HANDOFF,
            protocol.ready,
            open=True,
            errors=(503,),
        ),
    ]
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        model = protocol.for_this_model
        common += [
            Endpoint(
                "GET",
                prefix,
                "the model's inputs and outputs",
                HANDOFF,
                model(protocol.model_metadata),
                errors=(404, 503),
            ),
            Endpoint(
                "GET",
                f"{prefix}/ready",
                "the model's readiness",
                HANDOFF,
                model(protocol.ready),
                open=True,
                errors=(404, 503),
            ),
            Endpoint(
                "GET",
                f"{prefix}/config",
                "Triton's model configuration",
                HANDOFF,
                model(protocol.model_config),
                errors=(404, 503),
            ),
            Endpoint(
                "POST",
                f"{prefix}/infer",
                "the protocol's infer: JSON, or JSON and binary tensors (Inference-Header-Content-Length)",
                HANDOFF,
                protocol.infer,
                # tritonclient sends binary bodies with no Content-Type
                BodyRoute(frozenset({"", "application/json", "application/octet-stream"})),
                request={
                    "application/json": {"schema": {"type": "object"}},
                    "application/octet-stream": {"schema": BINARY},
                },
                errors=(400, 404, 408, 413, 415, 429, 503),
            ),
        ]
    # Anything else under /v2 (an unknown model's infer, a typo) is a JSON 404, never a text page.
    common += [
        Endpoint(method, "/v2/{rest:path}", "not a protocol endpoint", HANDOFF, protocol.not_found, documented=False)
        for method in ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD")
    ]
    table = RouteTable(common, model_name)
    return table
