"""Optional bearer-token gate (HANDOFF_API_KEYS): an ASGI middleware in front of everything else.

It runs before any body is read, so a client without a key holds no request slot and no memory. The
probes (/livez, /readyz, and the protocol's health and ready) stay open for the orchestrator, and so does the
page at / (static: it asks the person for the key and sends it with each call). Keys are compared in constant
time.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

PROBES = frozenset({"/livez", "/readyz", "/"})  # BentoML's probes and the page; the service adds the protocol's


def _token(scope: Scope) -> bytes:
    for name, value in scope.get("headers") or []:
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            return value[7:].strip()
    return b""


def key_is_valid(token: bytes, keys: tuple[bytes, ...]) -> bool:
    """Constant time in the token's content: every key is compared, whatever matched."""
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(token, key)
    return matched


class ApiKeyGate:
    def __init__(
        self, app: Callable[..., Awaitable[None]], keys: tuple[str, ...], open_paths: frozenset[str] = PROBES
    ) -> None:
        self.app = app
        self.keys = tuple(k.encode() for k in keys)
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope["path"] in self.open_paths:
            return await self.app(scope, receive, send)
        if key_is_valid(_token(scope), self.keys):
            return await self.app(scope, receive, send)
        body = json.dumps(
            {"error": "this service needs an API key: send the header `Authorization: Bearer KEY`"}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b'Bearer realm="handoff"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
