"""Keep /metrics bounded: BentoML labels its request metrics by the raw request path, so every unknown path
(a scanner's 10 KB of junk) would add series that live until the worker restarts.

BentoML's traffic-metrics middleware runs outside every user middleware, so the path cannot be cleaned up
on the way in. Instead its class is replaced, before the server builds its app, by a subclass that hands
it the scope with any path the service does not serve renamed to one constant (`UNKNOWN`), which the
router answers with 404 as it would have. This touches BentoML's private internals (bentoml is pinned
exactly in pyproject.toml); tests/test_serve.py checks the series count under junk paths.
"""

from __future__ import annotations

from typing import Any

UNKNOWN = "/__unknown_path__"


def bound_metric_labels(known_paths: set[str]) -> None:
    from bentoml._internal.server.http import instruments

    base = instruments.RunnerTrafficMetricsMiddleware
    if getattr(base, "handoff_bounded", False):
        return

    class BoundedPathMetrics(base):  # type: ignore[misc, valid-type]
        handoff_bounded = True

        async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope.get("type") == "http" and scope.get("path") not in known_paths:
                scope = {**scope, "path": UNKNOWN, "raw_path": UNKNOWN.encode()}
            await super().__call__(scope, receive, send)

    instruments.RunnerTrafficMetricsMiddleware = BoundedPathMetrics  # type: ignore[misc]
