"""Every route the service answers, in one table: `endpoints()`. serve/service.py builds the server from it.

A POST is read by the front door (serve/front_door.py: limits, content types, the request slots) and handed to
its handler; a GET goes to handoff's Starlette app or, for BentoML's probes, to BentoML. The same table gives
the OpenAPI document at /docs.json, the paths with their own /metrics series and the paths open without a key.
There are no `@bentoml.api` methods: each route's handler below is the code that answers it.
"""

from __future__ import annotations

from bentoml import get_current_service
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse

from serve.endpoint import APP, BENTOML, FRONT_DOOR, Endpoint, openapi_document
from serve.front_door import MULTIPART, BodyRoute
from serve.handlers import TEXT_TYPES, classify, detect, predict_tensor, segment
from serve.oip import ProtocolSurface
from serve.page import PAGE, PAGE_HEADERS
from serve.request_metrics import metrics_page

RAW_IMAGE_TYPES = ("image/jpeg", "image/png", "image/webp", "image/bmp", "image/gif")
CLASSIFY_FIELDS = {"image": "file", "top_k": "integer"}  # the multipart form's fields, checked by the front door
DETECT_FIELDS = {"image": "file"}  # /detect's and /segment's form
TOP_K = {"type": "integer", "minimum": 1, "maximum": 1000, "default": 5}
BINARY = {"type": "string", "format": "binary"}
TEXT_BODY = {
    "type": "object",
    "properties": {"text": {"type": "string"}, "top_k": TOP_K},
    "required": ["text"],
    "additionalProperties": False,
}
# /detect's and /segment's bodies: the form's one file, or the image itself
IMAGE_REQUEST = {
    MULTIPART: {"schema": {"type": "object", "properties": {"image": BINARY}, "required": ["image"]}},
    **{t: {"schema": BINARY} for t in RAW_IMAGE_TYPES},
}
PREDICT_BODY = {
    "type": "object",
    "description": 'a classifier\'s {"tensor": N x C x H x W nested lists}, '
    'or any model\'s {"inputs": {name: nested list}}',
}


async def page(request: Request) -> FileResponse:
    return FileResponse(PAGE, media_type="text/html", headers=PAGE_HEADERS)


async def info(request: Request) -> JSONResponse:
    return JSONResponse(get_current_service().describe())


def predict_limit() -> int:
    return get_current_service().max_predict_bytes()


def endpoints(protocol: ProtocolSurface, title: str, version: str) -> list[Endpoint]:
    """The table. `protocol` answers the Open Inference Protocol's rows for the served model."""

    async def docs(request: Request) -> JSONResponse:
        return JSONResponse(openapi_document(table, title, version))

    field_schemas = {"file": BINARY, "integer": TOP_K}  # the form's one integer is top_k
    image_form = {
        "type": "object",
        "properties": {name: field_schemas[kind] for name, kind in CLASSIFY_FIELDS.items()},
        "required": [name for name, kind in CLASSIFY_FIELDS.items() if kind == "file"],
    }
    table = [
        Endpoint("GET", "/", "a page to try the model in a browser", APP, page, open=True, answer=("text/html", {})),
        Endpoint("GET", "/info", "what is served: the model, its signature, the runtime and device", APP, info),
        Endpoint("GET", "/metrics", "Prometheus metrics", APP, metrics_page, answer=("text/plain", {})),
        Endpoint("GET", "/docs.json", "this OpenAPI document", APP, docs),
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
        Endpoint(
            "POST",
            "/classify",
            "classes, best first: an image (a multipart form with `image` and `top_k`, or the image as the body), "
            'or for a text classifier a text ({"text": ..., "top_k": K} or text/plain)',
            FRONT_DOOR,
            BodyRoute(frozenset({MULTIPART, *RAW_IMAGE_TYPES, *TEXT_TYPES}), classify, CLASSIFY_FIELDS),
            request={
                MULTIPART: {"schema": image_form},
                **{t: {"schema": BINARY} for t in RAW_IMAGE_TYPES},
                "application/json": {"schema": TEXT_BODY},
                "text/plain": {"schema": {"type": "string"}},
            },
            query=({"name": "top_k", "in": "query", "required": False, "schema": TOP_K},),
            errors=(400, 404, 408, 413, 415, 429, 503),
        ),
        Endpoint(
            "POST",
            "/detect",
            "a detector's detections, best first, boxes in the image's pixels: an image (a multipart form with "
            "`image`, or the image as the body)",
            FRONT_DOOR,
            BodyRoute(frozenset({MULTIPART, *RAW_IMAGE_TYPES}), detect, DETECT_FIELDS),
            request=IMAGE_REQUEST,
            errors=(400, 404, 408, 413, 415, 429, 503),
        ),
        Endpoint(
            "POST",
            "/segment",
            "a segmenter's class per pixel, as a PNG of class indices in the image's size (`?format=json`: the "
            "classes present and their share): an image (a multipart form with `image`, or the image as the body)",
            FRONT_DOOR,
            BodyRoute(frozenset({MULTIPART, *RAW_IMAGE_TYPES}), segment, DETECT_FIELDS),
            request=IMAGE_REQUEST,
            query=({"name": "format", "in": "query", "required": False, "schema": {"enum": ["png", "json"]}},),
            answer=("image/png", {}),
            errors=(400, 404, 408, 413, 415, 429, 503),
        ),
        Endpoint(
            "POST",
            "/predict",
            "a preprocessed tensor's logits and probabilities, or any model's outputs by name",
            FRONT_DOOR,
            BodyRoute(frozenset({"application/json"}), predict_tensor, max_bytes=predict_limit),
            request={"application/json": {"schema": PREDICT_BODY}},
            errors=(400, 408, 413, 415, 429, 503),
        ),
        Endpoint("GET", "/v2", "the protocol's server metadata", APP, protocol.server_metadata),
        Endpoint("GET", "/v2/health/live", "the protocol's liveness", APP, protocol.live, open=True),
        Endpoint(
            "GET",
            "/v2/health/ready",
            "the protocol's readiness (503 until ready)",
            APP,
            protocol.ready,
            open=True,
            errors=(503,),
        ),
    ]
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        model = protocol.for_this_model
        table += [
            Endpoint(
                "GET", prefix, "the model's inputs and outputs", APP, model(protocol.model_metadata), errors=(404, 503)
            ),
            Endpoint(
                "GET",
                f"{prefix}/ready",
                "the model's readiness",
                APP,
                model(protocol.ready),
                open=True,
                errors=(404, 503),
            ),
            Endpoint(
                "GET",
                f"{prefix}/config",
                "Triton's model configuration",
                APP,
                model(protocol.model_config),
                errors=(404, 503),
            ),
            Endpoint(
                "POST",
                f"{prefix}/infer",
                "the protocol's infer: JSON, or JSON and binary tensors (Inference-Header-Content-Length)",
                FRONT_DOOR,
                # tritonclient sends binary bodies with no Content-Type
                BodyRoute(frozenset({"", "application/json", "application/octet-stream"}), protocol.infer),
                request={
                    "application/json": {"schema": {"type": "object"}},
                    "application/octet-stream": {"schema": BINARY},
                },
                errors=(400, 404, 408, 413, 415, 429, 503),
            ),
        ]
    # Anything else under /v2 (an unknown model's infer, a typo) is a JSON 404, never a text page.
    table += [
        Endpoint(method, "/v2/{rest:path}", "not a protocol endpoint", APP, protocol.not_found, documented=False)
        for method in ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD")
    ]
    return table
