"""The service's front door: an ASGI middleware that bounds every request and routes the ones with a body.

For a POST to a route that takes a body (`BodyRoute`), it checks the request before anything is parsed: 413
for a body over the route's limit (declared or counted), 415 for a wrong content type, 400 for wrong
multipart fields (BentoML itself answers a malformed form with 500), 408 for a body that does not arrive in
time. The body is read once, here, and handed to the route's own handler (the image of a form or a raw body,
a JSON document...), instead of BentoML parsing it again on the event loop or into a temporary file.

A POST to any other path is passed on without reading its body: only the routes that take a body can hold a
reading slot or the memory of one (the API-key gate, outside this middleware, has already turned away a
request without a valid key).

It owns the limit on requests in progress (429 past it), and takes a slot only once the whole body is in: a
client that opens many uploads and stalls them (one byte, then nothing) holds reading slots for at most the
body deadline, never the slots the model's requests need. A request framed two ways (Transfer-Encoding and
Content-Length) is refused and its connection closed (RFC 9112 6.1), and a handler's unexpected exception
becomes a logged 500 at once instead of a response that never starts."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import orjson

from serve.form import BadForm, read_form
from serve.logs import printable

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
# A route's own handler: the body it takes (a form's file field, or the whole body) and its parameters (the
# form's other fields, or the query string's), answered without BentoML parsing the body a second time.
BodyHandler = Callable[[Scope, bytes, dict[str, list[str]], Send], Awaitable[None]]

log = logging.getLogger("bentoml.handoff.front_door")

READING_PER_SLOT = 4
MULTIPART = "multipart/form-data"


async def send_json(send: Send, status: int, payload: dict[str, Any] | bytes, close: bool = False) -> None:
    """A JSON response (`payload` already encoded, or to encode here); `close` asks the server to close the
    connection after it."""
    try:
        # ~10x the standard library's speed on a response of a few numbers
        body = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    except orjson.JSONEncodeError:  # a lone surrogate in a client's text, which orjson refuses: escaped instead
        body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _json_error(send: Send, status: int, message: str, close: bool = False) -> None:
    await send_json(send, status, {"error": message}, close)


@dataclass(frozen=True)
class BodyRoute:
    """A POST route whose body the front door reads, checks and hands to `handler`."""

    media_types: frozenset[str]
    """the Content-Types it takes ("" for a body sent without one)"""
    handler: BodyHandler
    form_fields: dict[str, str] = field(default_factory=dict)
    """a multipart form's fields ({name: "file" | "integer" | "text"}); the file field's bytes go to the handler"""
    max_bytes: Callable[[], int] | None = None
    """this route's own, tighter limit on the body (asked at each request: it may depend on the loaded model)"""


class Slots:
    """Slots counted on the event loop and never waited for: a request that finds none free is refused at once.
    (anyio's Semaphore, used before, yields to the loop on every acquire: two more turns of it per request.)"""

    def __init__(self, total: int) -> None:
        self.free = total

    def __enter__(self) -> None:
        self.free -= 1

    def __exit__(self, *_: object) -> None:
        self.free += 1


class FrontDoor:
    def __init__(
        self,
        app: Callable[..., Awaitable[None]],
        max_bytes: int,
        routes: dict[str, BodyRoute],
        max_concurrency: int,
        body_timeout_s: float,
        max_connections: int | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.routes = routes
        self.body_timeout_s = body_timeout_s
        self.processing = Slots(max_concurrency)  # requests whose body is in, being answered
        # Uploads still arriving: cheap while they stall (a socket, a few bytes), and each lasts at most the
        # deadline, so more of them than of requests in progress may wait at once; but never more than half the
        # connection cap, or stalled uploads, which are never shed, would leave no connection for a probe.
        reading = READING_PER_SLOT * max_concurrency
        self.reading = Slots(min(reading, max(1, max_connections // 2)) if max_connections else reading)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # no route takes one: closed before it is accepted (HTTP 403)
            return await send({"type": "websocket.close", "code": 1008})
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = scope.get("headers") or []
        names = {name for name, _ in headers}
        if b"transfer-encoding" in names and b"content-length" in names:
            # Two framings: a proxy in front may read the body one way and the server another (smuggling). llhttp
            # refuses such a request before it gets here; h11, uvicorn's other parser, does not.
            return await _json_error(
                send, 400, "the request has both Transfer-Encoding and Content-Length; send one", close=True
            )
        route = self.routes.get(scope["path"]) if scope["method"] == "POST" else None
        if route is None:  # no body to read here: the app answers (and never reads a body it does not take)
            return await _guarded(scope, send, lambda tracked: self.app(scope, receive, tracked))
        await self._serve(scope, route, dict(headers), receive, send)

    async def _serve(
        self, scope: Scope, route: BodyRoute, headers: dict[bytes, bytes], receive: Receive, send: Send
    ) -> None:
        limit = min(self.max_bytes, route.max_bytes()) if route.max_bytes else self.max_bytes
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await self._refuse(send, limit)
        sent = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        if sent not in route.media_types:
            accepted = " or ".join(sorted(t for t in route.media_types if t) or ["no Content-Type"])
            return await _json_error(
                send, 415, f"{scope['path']} takes {accepted}, not {sent or 'a body without a type'}"
            )
        if not self.reading.free:
            return await _json_error(send, 429, "too many uploads in progress; retry shortly")
        deadline = asyncio.timeout(self.body_timeout_s)
        try:
            with self.reading:
                async with deadline:
                    body = await _read_body(receive, limit)
        except TimeoutError:
            if not deadline.expired():
                raise
            return await _json_error(send, 408, f"the request body did not arrive within {self.body_timeout_s:g} s")
        if body is None:
            return  # the client left
        if len(body) > limit:
            return await self._refuse(send, limit)
        if sent == MULTIPART:
            try:
                body, params = read_form(headers.get(b"content-type", b"").decode("latin-1"), body, route.form_fields)
            except BadForm as err:
                return await _json_error(send, 400, str(err))
        else:  # any other body's parameters are its query string's
            params = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        if not self.processing.free:
            return await _json_error(send, 429, "too many requests in progress; retry with backoff")
        with self.processing:
            await _guarded(scope, send, lambda tracked: route.handler(scope, body, params, tracked))

    @staticmethod
    async def _refuse(send: Send, limit: int) -> None:
        await _json_error(send, 413, f"request body is larger than the limit of {limit} bytes")


async def _guarded(scope: Scope, send: Send, respond: Callable[[Send], Awaitable[None]]) -> None:
    """`respond(send)`; an exception it lets escape is logged with its traceback and answered 500 at once (left
    alone, BentoML's timeout middleware would wait out HANDOFF_TIMEOUT_S and answer a bare 500)."""
    started = False

    async def tracking_send(message: dict[str, Any]) -> None:
        nonlocal started
        started = True
        await send(message)

    try:
        await respond(tracking_send)
    except Exception:  # noqa: BLE001 - whatever it is, the client gets an answer and the log the cause
        log.exception("%s %s: unexpected error", scope.get("method"), printable(str(scope.get("path"))))
        if not started:
            await _json_error(send, 500, "internal error: the server's log has the cause")


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body (chunked bodies declare no length, so it is counted); None if the client left.
    Stops early past `limit`: the caller answers 413 for any body longer than that."""
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        more = message.get("more_body", False)
        if size > limit:
            break
    return b"".join(chunks)
