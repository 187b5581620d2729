"""The front door: the checks every route that takes a body gets before its handler runs (serve/http/router.py calls
it).

It checks a request before anything is parsed: 413 for a body over the route's limit (declared or counted), 415
for a wrong content type, 400 for wrong multipart fields (BentoML itself answers a malformed form with 500), 408
for a body that does not arrive in time. The body is read once, here, and handed to the route's handler (the image
of a form or a raw body, a JSON document...), instead of BentoML parsing it again on the event loop or into a
temporary file. A route that takes no body is never read: it holds no reading slot and no memory.

It owns the limit on requests in progress (429 past it), and takes a slot only once the whole body is in: a
client that opens many uploads and stalls them (one byte, then nothing) holds reading slots for at most the
body deadline, never the slots the model's requests need.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import orjson

from contract.errors import ClientError
from serve.http.deadline_sweep import DeadlineSweep
from serve.http.form import read_form

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

log = logging.getLogger("bentoml.handoff.front_door")

READING_PER_SLOT = 4
MULTIPART = "multipart/form-data"


def query_params(scope: Scope) -> dict[str, list[str]]:
    """The request's query string's parameters, blank values kept."""
    query = scope.get("query_string", b"")
    return parse_qs(query.decode("latin-1"), keep_blank_values=True) if query else {}


async def send_json(
    send: Send,
    status: int,
    payload: dict[str, Any] | bytes,
    close: bool = False,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """A JSON response (`payload` already encoded, or to encode here); `close` asks the server to close the
    connection after it; `headers` are added."""
    try:
        # ~10x the standard library's speed on a response of a few numbers
        body = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    except orjson.JSONEncodeError:  # a lone surrogate in a client's text, which orjson refuses: escaped instead
        body = json.dumps(payload).encode()
    sent = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    if close:
        sent.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": sent})
    await send({"type": "http.response.body", "body": body})


async def json_error(send: Send, status: int, message: str, close: bool = False) -> None:
    await send_json(send, status, {"error": message}, close)


@dataclass(frozen=True)
class BodyRoute:
    """What a route that takes a body accepts: the front door reads and checks it for the route's handler."""

    media_types: frozenset[str]
    """the Content-Types it takes ("" for a body sent without one)"""
    form_fields: dict[str, str] = field(default_factory=dict)
    """a multipart form's fields ({name: "file" | "integer" | "text"}); the file field's bytes go to the handler"""
    max_bytes: int | None = None
    """this route's own, tighter limit on the body (a served task's, from its model: a full batch of its input)"""
    takes: str = ""
    """what it takes, in words, for the 415 of a body of another type (default: the media types it takes)"""


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
        self, max_bytes: int, max_concurrency: int, body_timeout_s: float, max_connections: int | None = None
    ) -> None:
        self.max_bytes = max_bytes
        self.body_deadlines = DeadlineSweep(body_timeout_s)
        self.processing = Slots(max_concurrency)  # requests whose body is in, being answered
        # Uploads still arriving: cheap while they stall (a socket, a few bytes), and each lasts at most the
        # deadline, so more of them than of requests in progress may wait at once; but never more than half the
        # connection cap, or stalled uploads, which are never shed, would leave no connection for a probe.
        reading = READING_PER_SLOT * max_concurrency
        self.reading = Slots(min(reading, max(1, max_connections // 2)) if max_connections else reading)

    async def read(self, scope: Scope, route: BodyRoute, receive: Receive) -> tuple[bytes, dict[str, list[str]]] | None:
        """The body the route's handler takes (a form's file, or the whole body) and its parameters (the form's
        other fields, or the query string's); None if the client left. ClientError for a request refused here."""
        limit = min(self.max_bytes, route.max_bytes) if route.max_bytes else self.max_bytes
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        sent = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        if sent not in route.media_types:
            accepted = " or ".join(sorted(t for t in route.media_types if t) or ["no Content-Type"])
            takes = route.takes or f"{scope['path']} takes {accepted}"
            raise ClientError(f"{takes}, not {sent or 'a body without a type'}", 415)
        if not self.reading.free:
            raise ClientError("too many uploads in progress; retry shortly", 429, retry_after_s=1)
        deadline = self.body_deadlines.deadline()
        try:
            with self.reading:
                async with deadline:
                    body = await _read_body(receive, limit)
        except TimeoutError:
            if not deadline.expired():
                raise
            seconds = self.body_deadlines.seconds
            raise ClientError(f"the request body did not arrive within {seconds:g} s", 408) from None
        if body is None:
            return None  # the client left
        if len(body) > limit:
            raise _too_large(limit)
        if sent == MULTIPART:
            return read_form(headers.get(b"content-type", b"").decode("latin-1"), body, route.form_fields)
        # any other body's parameters are its query string's
        return body, query_params(scope)


def _too_large(limit: int) -> ClientError:
    return ClientError(f"request body is larger than the limit of {limit} bytes", 413)


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
