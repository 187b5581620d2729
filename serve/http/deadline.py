"""The request deadline (HANDOFF_TIMEOUT_S): a request whose response has not started by then is cancelled and
answered 504, as BentoML's own TimeoutMiddleware does, at less cost per request.

BentoML's runs each request in a task of its own and arms a timer it never cancels: every answered request
leaves its timer, future and closures on the event loop until the timeout passes (60 s of requests, ~4 KB
each), and pays a task switch. This one cancels the request in place (an `asyncio.timeout` that
serve/http/deadline_sweep.py expires, with no timer of its own), drops the deadline at the response's first message,
and frees it when the request ends. It is the outermost of handoff's middlewares (serve/http/front.py), and BentoML
builds it in its own middleware's place for the requests its app answers (serve/patches.py: no configuration
leaves BentoML's out).
"""

from __future__ import annotations

from typing import Any

from serve.http.deadline_sweep import DeadlineSweep
from serve.http.front_door import Receive, Scope, Send, send_json


class ResponseDeadline:
    """Stands in for bentoml's TimeoutMiddleware, with its arguments and its answer."""

    def __init__(self, app: Any, timeout: float) -> None:
        self.app = app
        self.sweep = DeadlineSweep(timeout)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        deadline = self.sweep.deadline()

        async def started_send(message: dict[str, Any]) -> None:
            self.sweep.forget(deadline)  # the response has begun: no deadline from here on
            await send(message)

        try:
            async with deadline:
                await self.app(scope, receive, started_send)
        except TimeoutError:
            if not deadline.expired():
                raise  # the app's own TimeoutError, not the deadline's: a 500 like any other fault
            await send_json(send, 504, {"error": f"Not able to process the request in {self.sweep.seconds} seconds"})
