"""The two places handoff still changes a dependency's code: each a last resort, each checked at start-up.

Everything else is configured through BentoML's public settings (serve/service.py's `SERVICE_CONFIG`) and
handoff's own middlewares (serve/http/front.py). These two have no public way in (docs/serve.md, "Where
handoff patches its dependencies", has the reproductions):

1. BentoML's TimeoutMiddleware. It arms a timer per request that it never cancels, so every answered request
   leaves a timer, a future and its closures on the event loop until the timeout passes, and it runs each
   request in a task of its own. No configuration leaves it out (`traffic.timeout` must be a positive number),
   so serve/http/deadline.py's ResponseDeadline, with the same argument and the same 504, is built in its place.
2. uvicorn's HTTP protocol. The bounds on connections (serve/http/connections.py) live below HTTP, where no ASGI
   middleware reaches; uvicorn takes a protocol class (`Config(http=...)`), but BentoML's worker builds its
   `uvicorn.Config` without passing one. So uvicorn's default ("auto") class is the guarded subclass. It also
   puts handoff's middlewares in front of BentoML's app where the service asks it to (serve/http/front.py).

Each replacement records that it took effect (ResponseDeadline when BentoML builds it, the guarded protocol
when it serves a connection): `not_in_effect()` names any that did not, and the service stays not ready
with that reason rather than serve unbounded. tests/unit/test_patches.py fails when upstream fixes either
defect, so the patch can go.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from serve.http.connections import ConnectionLimits, guarded
from serve.http.deadline import ResponseDeadline

TIMEOUT_MODULE, TIMEOUT_CLASS = "bentoml._internal.server.http.traffic", "TimeoutMiddleware"
PROTOCOL_MODULE, PROTOCOL_CLASS = "uvicorn.protocols.http.auto", "AutoHTTPProtocol"


class BentoMLsDeadline(ResponseDeadline):
    """ResponseDeadline where BentoML builds its TimeoutMiddleware, recording that it did (the self-check)."""

    built = False

    def __init__(self, app: Any, timeout: float) -> None:
        super().__init__(app, timeout)
        BentoMLsDeadline.built = True


def install(limits: ConnectionLimits, app_around: Callable[[Any], Any] | None = None) -> None:
    """Both replacements, before BentoML builds its app and its worker starts uvicorn (at import, in the worker);
    `app_around`: see serve/http/connections.py's `guarded`."""
    setattr(importlib.import_module(TIMEOUT_MODULE), TIMEOUT_CLASS, BentoMLsDeadline)
    protocols = importlib.import_module(PROTOCOL_MODULE)
    if not getattr(getattr(protocols, PROTOCOL_CLASS), "handoff_guarded", False):
        setattr(protocols, PROTOCOL_CLASS, guarded(getattr(protocols, PROTOCOL_CLASS), limits, app_around))


def not_in_effect() -> str | None:
    """Why the service must not be ready: a replacement upstream no longer picks up. Asked once a request has
    arrived (the readiness probe's own), by when BentoML has built its app and uvicorn served a connection."""
    missing = []
    if not BentoMLsDeadline.built:
        missing.append(f"the request deadline ({TIMEOUT_MODULE}.{TIMEOUT_CLASS} was not replaced)")
    protocol = getattr(importlib.import_module(PROTOCOL_MODULE), PROTOCOL_CLASS)
    if not getattr(protocol, "connections_served", 0):
        missing.append(f"the connection bounds ({PROTOCOL_MODULE}.{PROTOCOL_CLASS} did not serve this connection)")
    if not missing:
        return None
    return (
        "handoff's "
        + " and ".join(missing)
        + " did not take effect: this bentoml or uvicorn differs from the tested one"
    )
