"""Keep /metrics bounded: BentoML labels its request metrics by the raw request path, so every unknown path
(a scanner's 10 KB of junk) would add series that live until the worker restarts.

BentoML's traffic-metrics middleware runs outside every user middleware, so the path cannot be cleaned up
on the way in. Instead its class is replaced, before the server builds its app, by a subclass that hands
it the scope with any path the service does not serve renamed to one constant (`UNKNOWN`), and hands the app
behind it the scope with the path restored, so the router still answers the real path (a JSON 404 under /v2,
the protocol's form). This touches BentoML's private internals (bentoml is pinned exactly in pyproject.toml);
tests/test_serve.py checks the series count under junk paths.
"""

from __future__ import annotations

from typing import Any

UNKNOWN = "/__unknown_path__"
ORIGINAL = "handoff.original_path"  # the scope key that carries the real path past the metrics


def bound_metric_labels(known_paths: set[str]) -> None:
    from bentoml._internal.server.http import instruments

    base = instruments.RunnerTrafficMetricsMiddleware
    if getattr(base, "handoff_bounded", False):
        return

    class BoundedPathMetrics(base):  # type: ignore[misc, valid-type]
        handoff_bounded = True

        def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(_restoring_path(app), *args, **kwargs)

        async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope.get("type") == "http" and scope.get("path") not in known_paths:
                original = (scope.get("path"), scope.get("raw_path"))
                scope = {**scope, "path": UNKNOWN, "raw_path": UNKNOWN.encode(), ORIGINAL: original}
            await super().__call__(scope, receive, send)

    instruments.RunnerTrafficMetricsMiddleware = BoundedPathMetrics  # type: ignore[misc]


def _restoring_path(app: Any) -> Any:
    """`app`, called with the path the client sent (the metrics saw UNKNOWN in its place)."""

    async def restored(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if ORIGINAL in scope:
            path, raw_path = scope[ORIGINAL]
            scope = {key: value for key, value in scope.items() if key != ORIGINAL}
            scope["path"], scope["raw_path"] = path, raw_path
        await app(scope, receive, send)

    return restored
