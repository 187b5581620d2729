"""An ASGI middleware that answers oversized bodies with 413 and wrong content types with 415,
before BentoML reads or parses anything."""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class BodyTooLarge(Exception):
    pass


async def _json_error(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class RequestLimits:
    def __init__(self, app: Callable[..., Awaitable[None]], max_bytes: int, content_types: dict[str, str]) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.content_types = content_types  # route -> the one media type it accepts

    async def _refuse(self, send: Send) -> None:
        await _json_error(send, 413, f"request body is larger than the limit of {self.max_bytes} bytes")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send)
        expected = self.content_types.get(scope["path"]) if scope["method"] == "POST" else None
        sent = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        if expected and sent != expected:
            return await _json_error(send, 415, f"{scope['path']} takes {expected}, not {sent or 'a body without a type'}")
        seen = 0

        async def counting_receive() -> dict[str, Any]:  # chunked bodies carry no length: count them
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge()
            return message

        started = False

        async def tracking_send(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._refuse(send)
