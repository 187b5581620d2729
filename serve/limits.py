"""An ASGI middleware that checks POST requests before BentoML reads them: 413 for a body over the limit
(declared or counted), 415 for a wrong content type, 400 for wrong multipart fields (BentoML itself
answers a malformed form with 500), 408 for a body that does not arrive in time. An image route may also
take a raw body (the image as it is, no form); its forms and raw bodies go to the route's own handler, parsed
once here, instead of BentoML parsing the form again into a temporary file.

It also owns the limit on requests in progress (429 past it), and takes a slot only once the whole body is
in: a client that opens many uploads and stalls them (one byte, then nothing) holds reading slots for at
most the body deadline, never the slots the model's requests need."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import anyio

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
# A route's own handler for an image: its bytes and its parameters (the form's other fields for a multipart
# upload, the query string's for a raw body), answered without BentoML parsing the body a second time.
ImageHandler = Callable[[Scope, bytes, dict[str, list[str]], Send], Awaitable[None]]


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


class BadForm(ValueError):
    """What is wrong with a multipart body, in words the client can act on (answered with 400)."""


async def read_form(scope: Scope, body: bytes, fields: dict[str, str]) -> tuple[bytes, dict[str, list[str]]]:
    """A multipart body checked against its route's fields (unknown, missing, repeated, a text where a file
    belongs): the file field's bytes and the other fields' values. Raises BadForm."""
    from starlette.requests import Request

    try:
        form = await Request(scope, _replay(body)).form()
    except Exception as err:  # noqa: BLE001 - any parse failure is the client's malformed body
        raise BadForm(f"malformed multipart body ({err})") from None
    try:
        unknown = sorted(set(form.keys()) - set(fields))
        if unknown:
            raise BadForm(f"unknown field(s) {', '.join(unknown)}; expected {', '.join(fields)}")
        file, params = b"", {}
        for name, kind in fields.items():
            values = form.getlist(name)
            if len(values) > 1:  # two readers could pick different ones: refuse the ambiguity
                raise BadForm(f"field '{name}' is given {len(values)} times; send it once")
            value = values[0] if values else None
            if kind == "file":
                if value is None:
                    raise BadForm(f"missing file field '{name}'")
                if isinstance(value, str):
                    raise BadForm(f"field '{name}' must be a file upload")
                file = await value.read()
            elif value is not None:
                if kind == "integer" and not small_integer(value):
                    raise BadForm(f"field '{name}' must be a whole number of at most {MAX_DIGITS} digits")
                params[name] = [str(value)]
        return file, params
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
        image_routes: dict[str, tuple[frozenset[str], ImageHandler]] | None = None,
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
        self.image_routes = image_routes or {}  # route -> (the raw media types it also takes, its handler)

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
        raw_types, handler = self.image_routes.get(scope["path"], (frozenset(), None))
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
        fields = self.form_fields.get(scope["path"])
        image, params = body, {}
        if sent in raw_types:  # a raw body's parameters are its query string's
            params = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        elif fields:
            try:
                image, params = await read_form(scope, body, fields)
            except BadForm as err:
                return await _json_error(send, 400, str(err))
            if handler is not None:
                body = b""  # only the image is kept while the request waits for the model
        if self.processing.value == 0:
            return await _json_error(send, 429, "too many requests in progress; retry with backoff")
        async with self.processing:
            if handler is not None:
                await handler(scope, image, params, send)
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
