"""BentoML's request metrics, kept bounded and made cheap: the same Prometheus series, names and values.

Bounded: BentoML labels its request metrics by the raw request path, so every unknown path (a scanner's 10 KB
of junk) would add series that live until the worker restarts. Its traffic-metrics middleware runs outside
every user middleware, so the path cannot be cleaned up on the way in. Instead its class is replaced, before
the server builds its app, by a subclass that counts any path the service does not serve under one constant
(`UNKNOWN`), and hands the app behind it the real path, so the router still answers it (a JSON 404 under /v2,
the protocol's form). tests/test_serve.py checks the series count under junk paths.

Cheap: for each request BentoML looks up four labelled series by five label values each (`labels()`: sorting
and checking the values, a lock) and wraps `receive` as well as `send`: 70 us of the event loop's CPU per
request in process (`bench/stack_cost.py`), more than the front door's. The subclass keeps each series it has
looked up, by path (and status), and updates the same series the same way: the last-request time, the
requests in progress, then the request's count and duration once its response has ended. WebSockets (the
service has none) and /metrics itself go through BentoML's own code.

This touches BentoML's private internals (bentoml is pinned exactly in pyproject.toml).
"""

from __future__ import annotations

from timeit import default_timer
from typing import Any

UNKNOWN = "/__unknown_path__"

METRICS = {  # our short names for the attributes BentoML's middleware keeps its metrics in
    "timestamp": "metrics_last_request_timestamp",
    "in_progress": "metrics_request_in_progress",
    "total": "metrics_request_total",
    "duration": "metrics_request_duration",
}


def bound_metric_labels(known_paths: set[str]) -> None:
    from bentoml._internal.context import server_context
    from bentoml._internal.server.http import instruments

    base = instruments.RunnerTrafficMetricsMiddleware
    if getattr(base, "handoff_bounded", False):
        return

    class BoundedPathMetrics(base):  # type: ignore[misc, valid-type]
        handoff_bounded = True

        def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(app, *args, **kwargs)
            self.skipped = tuple(self.skip_paths)  # fixed once built; BentoML made this tuple on every request
            self.series: dict[tuple[str, str, int], Any] = {}  # (metric, path, status) -> its labelled series

        def _series(self, metric: str, endpoint: str, status: int = 0) -> Any:
            """The series of `metric` for `endpoint` (and `status`), looked up once, as BentoML labels it."""
            key = (metric, endpoint, status)
            found = self.series.get(key)
            if found is None:
                service = {
                    "service_name": server_context.bento_name,
                    "service_version": server_context.bento_version,
                    "runner_name": server_context.service_name,
                }
                labels = service if metric == "timestamp" else {**service, "endpoint": endpoint}
                if metric in ("total", "duration"):
                    labels["http_response_code"] = status  # type: ignore[assignment]
                found = self.series[key] = getattr(self, METRICS[metric]).labels(**labels)
            return found

        async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
            if not self._is_setup:
                self._setup()
            if scope["type"] != "http" or scope["path"] == "/metrics":
                return await super().__call__(scope, receive, send)
            endpoint = scope["path"] if scope["path"] in known_paths else UNKNOWN
            if not endpoint.startswith(self.skipped):
                self._series("timestamp", "").set_to_current_time()
            started, status = default_timer(), 0

            async def counted_send(message: dict[str, Any]) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                elif message["type"] == "http.response.body" and not message.get("more_body", False):
                    self._series("total", endpoint, status).inc()
                    self._series("duration", endpoint, status).observe(max(default_timer() - started, 0))
                await send(message)

            in_progress = self._series("in_progress", endpoint)
            in_progress.inc()
            try:
                await self.app(scope, receive, counted_send)
            finally:
                in_progress.dec()

    instruments.RunnerTrafficMetricsMiddleware = BoundedPathMetrics  # type: ignore[misc]
