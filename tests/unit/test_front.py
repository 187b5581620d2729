"""serve/http/front.py: handoff's middlewares called by uvicorn's (guarded) protocol in front of the service's app, on a
real socket: uvicorn's proxy-header wrapper stays outermost with its settings, the middlewares run in their order,
and what they pass on reaches the service's app."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from serve.http.connections import ConnectionLimits, guarded
from serve.http.front import Front

seen: list[tuple[str, Any]] = []


class Tag:
    """A middleware that records the request's client (as uvicorn's proxy headers left it) and passes it on."""

    def __init__(self, app: Any, name: str) -> None:
        self.app, self.name = app, name

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        seen.append((self.name, scope.get("client")))
        await self.app(scope, receive, send)


async def service_app(scope: dict, receive: Any, send: Any) -> None:
    """Stands in for BentoML's app: the innermost."""
    seen.append(("service", scope.get("client")))
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def test_the_front_runs_between_uvicorns_wrappers_and_the_services_app():
    front = Front([(Tag, {"name": "outer"}), (Tag, {"name": "inner"})])
    config = uvicorn.Config(app=service_app, proxy_headers=True, forwarded_allow_ips="127.0.0.1")
    config.load()
    protocol = guarded(config.http_protocol_class, ConnectionLimits(8, 5.0, 5.0, 5.0), front.around)

    async def two_requests() -> list[bytes]:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: protocol(config, ServerState(), {}), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        answers = []
        for _ in range(2):  # two connections: the front is built once
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nx-forwarded-for: 203.0.113.7\r\nconnection: close\r\n\r\n")
            answers.append(await reader.read())
            writer.close()
        server.close()
        return answers

    seen.clear()
    answers = asyncio.run(two_requests())
    assert all(answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok") for answer in answers)
    # The proxy's client, as uvicorn's wrapper (outside the front, its trusted hosts kept) rewrote it.
    assert [name for name, _ in seen] == ["outer", "inner", "service"] * 2
    assert {client[0] for _, client in seen} == {"203.0.113.7"}
    built = front.around(config.loaded_app)
    assert built is front.around(config.loaded_app) and type(built) is type(config.loaded_app)
    assert built.app is not config.loaded_app.app and config.loaded_app.app is service_app  # uvicorn's own untouched


def test_uvicorn_makes_its_access_line_only_where_its_logger_writes_it():
    """uvicorn builds its access line's arguments (the quoted path, the client) for every response whenever a
    handler exists anywhere up to the root; the guarded protocol turns that off unless `uvicorn.access` is enabled
    for INFO, and leaves it on where a user's logging writes the line."""
    import logging

    config = uvicorn.Config(app=service_app, log_config=None)
    config.load()
    protocol = guarded(config.http_protocol_class, ConnectionLimits(8, 5.0, 5.0, 5.0))
    access, root = logging.getLogger("uvicorn.access"), logging.getLogger()
    handler, loop = logging.NullHandler(), asyncio.new_event_loop()
    root.addHandler(handler)  # as BentoML's server logging: a handler on the root, the access logger at WARNING
    try:
        made = []
        for level in (logging.WARNING, logging.INFO):
            access.setLevel(level)
            made.append(protocol(config, ServerState(), {}, loop).access_log)
        assert made == [False, True]
    finally:
        root.removeHandler(handler)
        access.setLevel(logging.NOTSET)
        loop.close()
