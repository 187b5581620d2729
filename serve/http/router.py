"""The one router: every request, GET or POST, is matched against the route table (serve/http/endpoint.py's
`RouteTable`: serve/http/routes.py's routes and the served task's) here and answered by its row's handler; only
BentoML's own rows (its probes) go on to BentoML, and a path the table does not hold is a JSON 404. It is the
innermost of handoff's middlewares, so the access log, the metrics and the API-key gate have seen the request first.

For a row that takes a body, the front door (serve/http/front_door.py) reads and bounds it first and the request then
holds a processing slot while it is answered. A handler answers with an `Answer`, or raises the one client error
(contract/errors.py), which becomes `{"error": ...}` with its status here and nowhere else: logged as one line when
a handler raised it, recorded by the access line alone when the request was refused before (no route, the front
door's size, type, slot and deadline checks), so that a flood of refusals costs no logging on the event loop.
A request framed two ways (Transfer-Encoding and Content-Length) is refused and its connection closed (RFC 9112
6.1), and a handler's unexpected exception becomes a logged 500 at once instead of a response that never starts.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from contract.errors import ClientError
from serve.http.endpoint import Answer, Endpoint, Incoming, RouteTable, plain_error
from serve.http.front_door import FrontDoor, Receive, Scope, Send, json_error, query_params, send_json
from serve.http.refusal_pace import PACED, RefusalPace
from serve.observability.logs import CLIENT_ERROR, Repeats, client_error_args, printable

log = logging.getLogger("bentoml.handoff")
refusals = Repeats(log)  # refusals for load, summarized
pace = RefusalPace()  # and paced when they come faster than clients should send them


class Router:
    def __init__(self, app: Callable[..., Awaitable[None]], routes: RouteTable, front_door: FrontDoor) -> None:
        self.app = app
        self.routes = routes
        self.front_door = front_door

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # no route takes one: closed before it is accepted (HTTP 403)
            return await send({"type": "websocket.close", "code": 1008})
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        names = {name for name, _ in scope.get("headers") or []}
        if b"transfer-encoding" in names and b"content-length" in names:
            # Two framings: a proxy in front may read the body one way and the server another (smuggling). llhttp
            # refuses such a request before it gets here; h11, uvicorn's other parser, does not.
            return await json_error(
                send, 400, "the request has both Transfer-Encoding and Content-Length; send one", close=True
            )
        try:
            return await self._dispatch(scope, receive, send)
        except ClientError as err:  # refused before any handler ran: the access line records it, no line of its own
            # Its traceback's frames hold what the request sent (a body read whole, refused for want of a slot):
            # let go before the answer, which may be paced (held by no slot, so bounded by no slot either).
            refused = err.with_traceback(None)
            refused.__context__ = None
        found = self.routes.match(scope["method"], scope["path"])  # again only for a refusal: its route's shape
        body = found[0].error_body(refused) if found is not None else plain_error(refused)
        await send_error(scope, send, refused, body)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self.routes.match(scope["method"], scope["path"])
        if found is None:  # never reading a body it would not take
            raise self.routes.unmatched(scope["method"], scope["path"])
        endpoint, path_params = found
        if endpoint.handler is None:  # BentoML's own probes
            return await _guarded(scope, send, lambda tracked: self.app(scope, receive, tracked))
        if endpoint.body is None:
            incoming = Incoming(scope, params=query_params(scope), path_params=path_params)
            return await _guarded(scope, send, lambda tracked: _respond(endpoint, incoming, tracked))
        read = await self.front_door.read(scope, endpoint.body, receive)
        if read is None:
            return  # the client left
        if not self.front_door.processing.free:
            raise ClientError("too many requests in progress; retry with backoff", 429, retry_after_s=1)
        incoming = Incoming(scope, *read, path_params=path_params, receive=receive)
        with self.front_door.processing:
            await _guarded(scope, send, lambda tracked: _respond(endpoint, incoming, tracked))


async def _respond(endpoint: Endpoint, incoming: Incoming, send: Send) -> None:
    assert endpoint.handler is not None
    try:
        if endpoint.admit is not None:
            endpoint.admit()
        answer = await endpoint.handler(incoming)
    except ClientError as err:
        return await send_client_error(incoming.scope, send, err, endpoint.error_body)
    await send_answer(send, answer)


async def send_answer(send: Send, answer: Answer) -> None:
    if answer.stream is not None:
        return await _send_stream(send, answer)
    if answer.media_type == "application/json":
        return await send_json(send, answer.status, answer.body, headers=answer.headers)
    body = answer.body if isinstance(answer.body, bytes) else b""
    headers = list(answer.headers)
    if answer.media_type is not None:
        headers.append((b"content-type", answer.media_type.encode()))
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_stream(send: Send, answer: Answer) -> None:
    """A body of unknown length (chunked), each piece sent as it comes; the stream is closed however it ends."""
    assert answer.stream is not None
    headers = [*answer.headers, (b"cache-control", b"no-cache")]
    if answer.media_type is not None:
        headers.append((b"content-type", answer.media_type.encode()))
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    try:
        async for piece in answer.stream:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
    finally:
        await answer.stream.aclose()  # type: ignore[attr-defined]
    await send({"type": "http.response.body", "body": b""})


async def send_client_error(
    scope: Scope, send: Send, error: ClientError, body: Callable[[ClientError], dict[str, Any]] = plain_error
) -> None:
    """The error's `body` (`{"error": ...}` unless the route answers another API's) with its status, logged as one
    line (INFO for a 4xx, WARNING for a 5xx): a client's mistake is never a traceback. A refusal for load (with
    Retry-After) is summarized: under load they come by the thousand a second."""
    line = client_error_args(scope["method"], scope["path"], error.status, error)
    level = logging.INFO if error.status < 500 else logging.WARNING
    if error.retry_after_s is not None:
        refusals.log(level, f"{error.status} {error}", CLIENT_ERROR, *line)
    else:
        log.log(level, CLIENT_ERROR, *line)
    await send_error(scope, send, error, body(error))


async def send_error(scope: Scope, send: Send, error: ClientError, body: dict[str, Any]) -> None:
    """`body` with the error's status, and Retry-After for an error that passes with time (an overloaded model, a
    full server): a client that waits as it says, as HTTP asks, does not spend the server's CPU on requests refused
    again. One that does not is paced (serve/http/refusal_pace.py); while its refusal waits, its connection may be
    shed at the connection cap as an idle one is (`PACED` in its scope: serve/http/connections.py), so a flood of
    paced refusals never keeps a fresh connection, a probe's, out."""
    if error.retry_after_s is None:
        return await send_json(send, error.status, body)
    scope[PACED] = True
    await pace.wait(error.retry_after_s)
    scope[PACED] = False
    await send_json(send, error.status, body, headers=[(b"retry-after", str(error.retry_after_s).encode())])


async def _guarded(scope: Scope, send: Send, respond: Callable[[Send], Awaitable[Any]]) -> None:
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
            await json_error(send, 500, "internal error: the server's log has the cause")
