"""An ASGI middleware that checks POST requests before BentoML reads them: 413 for a body over the limit
(declared or counted), 415 for a wrong content type, 400 for wrong multipart fields (BentoML itself
answers a malformed form with 500), 408 for a body that does not arrive in time. A route may also take a
raw body (an image as it is, no form): that body goes to the route's own handler, not through BentoML.

It also owns the limit on requests in progress (429 past it), and takes a slot only once the whole body is
in: a client that opens many uploads and stalls them (one byte, then nothing) holds reading slots for at
most the body deadline, never the slots the model's requests need."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
RawBodyHandler = Callable[[Scope, bytes, Send], Awaitable[None]]


async def send_json(send: Send, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _json_error(send: Send, status: int, message: str) -> None:
    await send_json(send, status, {"error": message})


def _replay(body: bytes) -> Receive:
    """A `receive` that hands the buffered body to the app once, then reports the client gone."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


MAX_DIGITS = 6
READING_PER_SLOT = 4


def small_integer(value: object) -> bool:
    """A short decimal integer: Python refuses to parse integers of thousands of digits, with a ValueError
    that BentoML would answer with 500."""
    text = value.strip() if isinstance(value, str) else ""
    return text.lstrip("+-").isdigit() and len(text) <= MAX_DIGITS


async def _form_problem(scope: Scope, body: bytes, fields: dict[str, str]) -> str | None:
    """What is wrong with a multipart body's fields (unknown, missing, or a text where a file belongs)."""
    from starlette.requests import Request

    try:
        form = await Request(scope, _replay(body)).form()
    except Exception as err:  # noqa: BLE001 - any parse failure is the client's malformed body
        return f"malformed multipart body ({err})"
    try:
        unknown = sorted(set(form.keys()) - set(fields))
        if unknown:
            return f"unknown field(s) {', '.join(unknown)}; expected {', '.join(fields)}"
        for name, kind in fields.items():
            values = form.getlist(name)
            if len(values) > 1:  # BentoML and this check could read different ones: refuse the ambiguity
                return f"field '{name}' is given {len(values)} times; send it once"
            value = values[0] if values else None
            if kind == "file" and not hasattr(value, "filename"):
                return f"missing file field '{name}'" if value is None else f"field '{name}' must be a file upload"
            if kind == "integer" and value is not None and not small_integer(value):
                return f"field '{name}' must be a whole number of at most {MAX_DIGITS} digits"
        return None
    finally:
        await form.close()


class RequestLimits:
    def __init__(
        self,
        app: Callable[..., Awaitable[None]],
        max_bytes: int,
        content_types: dict[str, str],
        form_fields: dict[str, dict[str, str]],
        max_concurrency: int,
        body_timeout_s: float,
        raw_bodies: dict[str, tuple[frozenset[str], RawBodyHandler]] | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.body_timeout_s = body_timeout_s
        self.processing = anyio.Semaphore(max_concurrency)  # requests whose body is in, being answered
        # Uploads still arriving: cheap while they stall (a socket, a few bytes), and each lasts at most the
        # deadline, so more of them than of requests in progress may wait at once.
        self.reading = anyio.Semaphore(READING_PER_SLOT * max_concurrency)
        self.content_types = content_types  # route -> the one media type it accepts
        self.form_fields = form_fields  # route -> {field: "file" | "integer" | "text"} of its multipart form
        self.raw_bodies = raw_bodies or {}  # route -> (the raw media types it also takes, their handler)

    async def _refuse(self, send: Send) -> None:
        await _json_error(send, 413, f"request body is larger than the limit of {self.max_bytes} bytes")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send)
        expected = self.content_types.get(scope["path"])
        sent = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        raw_types, raw_handler = self.raw_bodies.get(scope["path"], (frozenset(), None))
        if expected and sent != expected and sent not in raw_types:
            accepted = " or ".join([expected, *sorted(raw_types)])
            return await _json_error(
                send, 415, f"{scope['path']} takes {accepted}, not {sent or 'a body without a type'}"
            )
        if self.reading.value == 0:
            return await _json_error(send, 429, "too many uploads in progress; retry shortly")
        async with self.reading:
            with anyio.move_on_after(self.body_timeout_s) as deadline:
                body = await self._read_body(receive)
        if deadline.cancelled_caught:
            return await _json_error(send, 408, f"the request body did not arrive within {self.body_timeout_s:g} s")
        if body is None:
            return  # the client left
        if len(body) > self.max_bytes:
            return await self._refuse(send)
        raw_body = raw_handler if sent in raw_types else None  # the route's own handler takes this body
        fields = None if raw_body else self.form_fields.get(scope["path"])
        problem = await _form_problem(scope, body, fields) if fields else None
        if problem:
            return await _json_error(send, 400, problem)
        if self.processing.value == 0:
            return await _json_error(send, 429, "too many requests in progress; retry with backoff")
        async with self.processing:
            if raw_body is not None:
                await raw_body(scope, body, send)
            else:
                await self.app(scope, _replay(body), send)

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body (chunked bodies declare no length, so it is counted); None if the client left.
        Stops early past the limit: the caller answers 413 for any body longer than max_bytes."""
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.max_bytes:
                break
        return b"".join(chunks)
