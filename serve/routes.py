"""Every route the service answers, in one table: `endpoints()`. serve/service.py builds the server from it.

serve/router.py dispatches every request from this table: a row that takes a body (`body`) is read and bounded
by the front door first (serve/front_door.py: limits, content types, the request slots); BentoML's own probes are
listed so the table is whole. The same table gives the OpenAPI document at /docs.json (each task adds its own
request and answer schemas), the paths with their own /metrics series and the paths open without a key. The model's
routes (/classify, /detect, /segment, /embed, /rerank, /predict, ...) are answered by the served task
(serve/tasks/), or refused by it with a 404 that names the routes it does answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from bentoml import get_current_service  # resolved once: `bentoml.get_current_service` imports it on every use

from serve.endpoint import BENTOML, HANDOFF, JSON_OBJECT, Answer, Endpoint, Handler, Incoming, openapi_document
from serve.front_door import MULTIPART, BodyRoute
from serve.oip import ProtocolSurface
from serve.openai_api import ERROR_SCHEMA, error_body
from serve.page import PAGE, PAGE_HEADERS
from serve.request_metrics import metrics_page
from serve.tasks.images import RAW_IMAGE_TYPES
from serve.tasks.texts import TEXT_TYPES

if TYPE_CHECKING:
    from serve.service import ModelService

CLASSIFY_FIELDS = {"image": "file", "top_k": "integer"}  # the multipart form's fields, checked by the front door
DETECT_FIELDS = {"image": "file"}  # /detect's and /segment's form
TOP_K = {"type": "integer", "minimum": 1, "maximum": 1000, "default": 5}
BINARY = {"type": "string", "format": "binary"}
TEXT_BODY = {
    "type": "object",
    "properties": {"text": {"type": "string"}, "text_pair": {"type": "string"}, "top_k": TOP_K},
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
PAGE_BYTES = PAGE.read_bytes()
HTML_HEADERS = tuple((name.encode(), value.encode()) for name, value in PAGE_HEADERS.items())


def service() -> ModelService:
    return cast("ModelService", get_current_service())


async def page(request: Incoming) -> Answer:
    return Answer(PAGE_BYTES, "text/html; charset=utf-8", headers=HTML_HEADERS)


async def info(request: Incoming) -> Answer:
    return Answer(service().describe())


def task_route(route: str) -> Handler:
    """A model route: answered by the served task, or refused by it (404) if it is not one of the task's."""

    async def answer(request: Incoming) -> Answer:
        return await service().answer(route, request)

    return answer


def body_limit(route: str) -> int:
    return service().max_body_bytes(route)


def endpoints(protocol: ProtocolSurface, title: str, version: str) -> list[Endpoint]:
    """The table. `protocol` answers the Open Inference Protocol's rows for the served model."""

    async def docs(request: Incoming) -> Answer:
        return Answer(openapi_document(table, title, version, service().task_schemas()))

    field_schemas = {"file": BINARY, "integer": TOP_K}  # the form's one integer is top_k
    image_form = {
        "type": "object",
        "properties": {name: field_schemas[kind] for name, kind in CLASSIFY_FIELDS.items()},
        "required": [name for name, kind in CLASSIFY_FIELDS.items() if kind == "file"],
    }
    table = [
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
        Endpoint(
            "POST",
            "/classify",
            "classes, best first: an image (a multipart form with `image` and `top_k`, or the image as the body), "
            'or for a text classifier a text ({"text": ..., "top_k": K} or text/plain; a pair model\'s '
            '{"text": ..., "text_pair": ...})',
            HANDOFF,
            task_route("/classify"),
            BodyRoute(frozenset({MULTIPART, *RAW_IMAGE_TYPES, *TEXT_TYPES}), CLASSIFY_FIELDS),
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
            HANDOFF,
            task_route("/detect"),
            BodyRoute(frozenset({MULTIPART, *RAW_IMAGE_TYPES}), DETECT_FIELDS),
            request=IMAGE_REQUEST,
            errors=(400, 404, 408, 413, 415, 429, 503),
        ),
        Endpoint(
            "POST",
            "/segment",
            "a segmenter's class per pixel, as a PNG of class indices in the image's size (`?format=json`: the "
            "classes present and their share): an image (a multipart form with `image`, or the image as the body)",
            HANDOFF,
            task_route("/segment"),
            BodyRoute(frozenset({MULTIPART, *RAW_IMAGE_TYPES}), DETECT_FIELDS),
            request=IMAGE_REQUEST,
            query=({"name": "format", "in": "query", "required": False, "schema": {"enum": ["png", "json"]}},),
            answer=("image/png", {}),
            errors=(400, 404, 408, 413, 415, 429, 503),
        ),
        Endpoint(
            "POST",
            "/embed",
            "a sentence encoder's vectors, as text-embeddings-inference answers: "
            '{"inputs": text or [texts], "normalize": true, "truncate": false} -> [[...], ...]',
            HANDOFF,
            task_route("/embed"),
            BodyRoute(frozenset({"application/json"})),
            request={"application/json": {"schema": JSON_OBJECT}},
            errors=(400, 404, 408, 413, 415, 429, 503),
        ),
        Endpoint(
            "POST",
            "/v1/embeddings",
            "a sentence encoder's vectors, as OpenAI's embeddings API answers: "
            '{"input": text or [texts], "model": ...} -> {"object": "list", "data": [...], "usage": ...}',
            HANDOFF,
            task_route("/v1/embeddings"),
            BodyRoute(frozenset({"application/json"})),
            request={"application/json": {"schema": JSON_OBJECT}},
            errors=(400, 404, 408, 413, 415, 429, 503),
        ),
        Endpoint(
            "GET",
            "/v1/models",
            "a language model: the model served, as OpenAI's API lists models",
            HANDOFF,
            task_route("/v1/models"),
            errors=(404, 503),
            error_body=error_body,
            error_schema=ERROR_SCHEMA,
        ),
        Endpoint(
            "POST",
            "/v1/chat/completions",
            "a language model's reply to a chat, as OpenAI's (and vLLM's) chat completions answer: "
            '{"messages": [...], "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream"}; errors '
            'in OpenAI\'s body {"error": {"message", "type", "param", "code"}}',
            HANDOFF,
            task_route("/v1/chat/completions"),
            BodyRoute(frozenset({"application/json"}), max_bytes=lambda: body_limit("/v1/chat/completions")),
            request={"application/json": {"schema": JSON_OBJECT}},
            answer=("application/json", JSON_OBJECT),
            errors=(400, 404, 408, 413, 415, 429, 503),
            error_body=error_body,
            error_schema=ERROR_SCHEMA,
        ),
        Endpoint(
            "POST",
            "/v1/completions",
            "a language model's completion of a prompt, as OpenAI's (and vLLM's) completions answer: "
            '{"prompt": text or token ids, "max_tokens", ...as the chat\'s}',
            HANDOFF,
            task_route("/v1/completions"),
            BodyRoute(frozenset({"application/json"}), max_bytes=lambda: body_limit("/v1/completions")),
            request={"application/json": {"schema": JSON_OBJECT}},
            errors=(400, 404, 408, 413, 415, 429, 503),
            error_body=error_body,
            error_schema=ERROR_SCHEMA,
        ),
        Endpoint(
            "POST",
            "/rerank",
            "a cross-encoder's texts ranked by their relevance to a query, as text-embeddings-inference answers: "
            '{"query": ..., "texts": [...], "raw_scores": false, "return_text": false, "truncate": false} -> '
            '[{"index": i, "score": s}, ...], best first',
            HANDOFF,
            task_route("/rerank"),
            BodyRoute(frozenset({"application/json"})),
            request={"application/json": {"schema": JSON_OBJECT}},
            errors=(400, 404, 408, 413, 415, 429, 503),
        ),
        Endpoint(
            "POST",
            "/predict",
            "a preprocessed tensor's logits and probabilities, or any model's outputs by name",
            HANDOFF,
            task_route("/predict"),
            BodyRoute(frozenset({"application/json"}), max_bytes=lambda: body_limit("/predict")),
            request={"application/json": {"schema": PREDICT_BODY}},
            errors=(400, 408, 413, 415, 429, 503),
        ),
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
        table += [
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
    table += [
        Endpoint(method, "/v2/{rest:path}", "not a protocol endpoint", HANDOFF, protocol.not_found, documented=False)
        for method in ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD")
    ]
    return table
