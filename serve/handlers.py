"""What the front door hands the bodies of handoff's own endpoints to: POST /classify (a multipart form or a
raw image), POST /detect and /segment (an image) and POST /predict (JSON), each answered with JSON (or a
segmenter's PNG) or a 4xx naming the problem, logged as one line.

The Open Inference Protocol's infer has its own, in serve/oip_infer.py; both call the service instance's methods.
"""

from __future__ import annotations

import logging
import typing
from collections.abc import Callable
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs

from bentoml import get_current_service  # resolved once: `bentoml.get_current_service` imports it on every use
from bentoml.exceptions import BentoMLException

from serve.form import MAX_DIGITS, small_integer
from serve.front_door import Scope, Send, send_json
from serve.logs import CLIENT_ERROR, client_error_args
from serve.segmentation import SEGMENT_FORMATS
from train.pil_transform import BadImage

log = logging.getLogger("bentoml.handoff")


class RequestError(BentoMLException):
    """A 4xx with a JSON body naming the problem."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message, error_code=HTTPStatus(status))


async def _answer(scope: Scope, send: Send, answer: typing.Awaitable[dict[str, Any] | bytes]) -> None:
    """Send `answer`'s JSON, or a RequestError as a 4xx (5xx) with one log line: a client's mistake is one INFO
    line, never a traceback."""
    try:
        payload = await answer
    except BentoMLException as err:
        return await send_client_error(scope, send, err.error_code.value, err)
    await send_json(send, 200, payload)


async def send_client_error(scope: Scope, send: Send, status: int, error: BaseException) -> None:
    """`{"error": ...}` with `status`, logged as one line (INFO for a 4xx, WARNING for a 5xx), no traceback."""
    line = client_error_args(scope["method"], scope["path"], status, error)
    (log.info if status < 500 else log.warning)(CLIENT_ERROR, *line)
    await send_json(send, status, {"error": str(error)})


def _only_params(params: dict[str, list[str]], allowed: set[str]) -> None:
    unknown = sorted(set(params) - allowed)
    if unknown:
        expected = f"expected {', '.join(sorted(allowed))}" if allowed else "this endpoint takes none"
        raise RequestError(f"unknown query parameter(s) {', '.join(unknown)}; {expected}")


async def _classify_answer(image: bytes, params: dict[str, list[str]]) -> dict[str, Any]:
    _only_params(params, {"top_k"})
    values = params.get("top_k", ["5"])
    if len(values) > 1:
        raise RequestError(f"top_k is given {len(values)} times; send it once")
    if not small_integer(values[0]):
        raise RequestError(f"top_k must be a whole number of at most {MAX_DIGITS} digits")
    return await get_current_service().classify_upload(image, int(values[0]))


async def _decoded(service: Any, prepare: Callable[[bytes], Any], upload: bytes) -> Any:
    """A detector's or segmenter's `prepare` of one upload, in a decoding thread; a bad image is the client's 4xx."""
    try:
        return await service.decoders.run(prepare, upload)
    except BadImage as err:
        raise RequestError(str(err), status=err.status) from None


def checked_top_k(value: Any) -> int:
    """top_k from a form or query string (ASCII digits: not '²' or '①') or a JSON body (a number), 1 to 1000."""
    whole = isinstance(value, int) and not isinstance(value, bool)
    digits = isinstance(value, str) and small_integer(value) and len(value) <= 4
    top_k = int(value) if whole or digits else 0
    if not 1 <= top_k <= 1000:
        raise RequestError(f"top_k={str(value)[:20]}: must be between 1 and 1000")
    return top_k


def _not_this_task(service: Any, route: str, kind: str) -> RequestError:
    return RequestError(f"{route} is for {kind}; this model's task is {service.task}: see GET /info", 404)


async def _detect_answer(image: bytes, params: dict[str, list[str]]) -> dict[str, Any]:
    """The /detect answer for one image: the multipart form's file, or a raw body's bytes."""
    _only_params(params, set())
    service = get_current_service()
    service.require_ready()
    if service.detector is None:
        raise _not_this_task(service, "/detect", "detectors")
    rows, scale = await _decoded(service, service.detector.prepare, image)
    return service.detector.answer(await service.batched(rows), scale)


async def _segment_answer(image: bytes, form: str) -> dict[str, Any] | bytes:
    """The /segment answer for one image: its mask as a PNG (form "png"), or the classes it holds ("json")."""
    service = get_current_service()
    service.require_ready()
    if service.segmenter is None:
        raise _not_this_task(service, "/segment", "segmenters")
    rows, size = await _decoded(service, service.segmenter.prepare, image)
    outputs = await service.batched(rows)
    answer = service.segmenter.summary if form == "json" else service.segmenter.png
    # the mask resized to the upload's size and encoded, in a decoding thread: megabytes, never on the event loop
    return await service.decoders.run(lambda: answer(service.segmenter.mask(outputs, size)))


async def detect(scope: Scope, body: bytes, params: dict[str, list[str]], send: Send) -> None:
    """POST /detect: a detector's detections for an image, the multipart form (field `image`) or the image itself."""
    await _answer(scope, send, _detect_answer(body, params))


async def segment(scope: Scope, body: bytes, params: dict[str, list[str]], send: Send) -> None:
    """POST /segment: a segmenter's mask for an image (the multipart form's `image`, or the image itself), a PNG of
    class indices; `?format=json`: the classes present and their share of the pixels."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)  # a form's too
    try:
        _only_params(params | query, {"format"})
        form = (params | query).get("format", ["png"])[-1]
        if form not in SEGMENT_FORMATS:
            raise RequestError(f"format={form[:20]}: must be {' or '.join(SEGMENT_FORMATS)}")
        answer = await _segment_answer(body, form)
    except BentoMLException as err:
        return await send_client_error(scope, send, err.error_code.value, err)
    if isinstance(answer, dict):
        return await send_json(send, 200, answer)
    headers = [(b"content-type", b"image/png"), (b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


TEXT_TYPES = ("application/json", "text/plain")  # a text classifier's /classify bodies


def _content_type(scope: Scope) -> str:
    for name, value in scope.get("headers") or []:
        if name == b"content-type":
            return value.decode("latin-1").split(";")[0].strip().lower()
    return ""


async def classify(scope: Scope, body: bytes, params: dict[str, list[str]], send: Send) -> None:
    """POST /classify. An image: the multipart form (field `image`, optional `top_k`) or the image itself as the
    body (Content-Type: image/jpeg, image/png... and `?top_k=K`); serve/front_door.py parses the body once and
    hands it here, under its limits, instead of BentoML parsing the form again into a temporary file (A/B: 38.7
    -> 37.8 ms of server CPU per image at c=64, c=1 p50 23.2 -> 21.9 ms; docs/benchmarks.md). A text, for a text
    classifier: `{"text": "...", "top_k": K}` as JSON, or the text itself as text/plain (`?top_k=K`)."""
    kind = _content_type(scope)
    if kind in TEXT_TYPES:
        return await _answer(scope, send, get_current_service().classify_text(body, kind, params))
    await _answer(scope, send, _classify_answer(body, params))


async def _predict_answer(body: bytes, params: dict[str, list[str]]) -> dict[str, Any] | bytes:
    _only_params(params, set())
    return await get_current_service().predict_json(body)


async def predict_tensor(scope: Scope, body: bytes, params: dict[str, list[str]], send: Send) -> None:
    """POST /predict: the JSON body, bounded by what the model can take and parsed off the event loop."""
    await _answer(scope, send, _predict_answer(body, params))
