"""The request metrics on /metrics: BentoML's series names and values, counted by handoff's own middleware.

BentoML's own request metrics are turned off in the service's configuration (`metrics: {"enabled": False}`)
for two measured reasons. They are labelled by the raw request path, so every unknown path a scanner sends
would add series that live until the worker restarts; and its middleware looks up four labelled series by
five values for every request (tens of microseconds of the event loop each, docs/history.md). This
middleware, one of handoff's own (serve/http/front.py), keeps BentoML's series (`bentoml_service_request_total`,
`..._request_duration_seconds`, `..._request_in_progress`, `..._last_request_timestamp_seconds`) with the same
labels, counts a path the service does not serve under one constant (`UNKNOWN`), and looks each labelled
series up once. tests/test_serve.py checks the series under junk paths.

With several workers, BentoML's server gives each one PROMETHEUS_MULTIPROC_DIR: prometheus_client then keeps
the values in files there, and /metrics reads every worker's (prometheus_client's multiprocess mode).
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Container
from dataclasses import dataclass
from timeit import default_timer
from typing import Any

import bentoml
import prometheus_client
from prometheus_client import multiprocess
from starlette.concurrency import run_in_threadpool

from serve.http.endpoint import Answer, Incoming
from serve.http.front_door import Receive, Scope, Send

UNKNOWN = "/__unknown_path__"
NAMESPACE = "bentoml_service"
NOT_TIMESTAMPED = ("/metrics", "/healthz", "/livez", "/readyz")  # probes and scrapes are not "the last request"
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 180.0)
SERVICE_LABELS = ("service_name", "service_version", "runner_name")


@dataclass(frozen=True)
class RequestSeries:
    """The four metrics, made once per process (prometheus_client refuses a name registered twice)."""

    total: prometheus_client.Counter
    duration: prometheus_client.Histogram
    in_progress: prometheus_client.Gauge
    last_request: prometheus_client.Gauge


@functools.cache
def request_series() -> RequestSeries:
    by_path = [*SERVICE_LABELS, "endpoint"]
    by_status = [*by_path, "http_response_code"]
    return RequestSeries(
        prometheus_client.Counter("request_total", "Total number of HTTP requests", by_status, namespace=NAMESPACE),
        prometheus_client.Histogram(
            "request_duration_seconds",
            "API HTTP request duration in seconds",
            by_status,
            namespace=NAMESPACE,
            buckets=DURATION_BUCKETS,
        ),
        prometheus_client.Gauge(
            "request_in_progress",
            "Total number of HTTP requests in progress now",
            by_path,
            namespace=NAMESPACE,
            multiprocess_mode="livesum",
        ),
        prometheus_client.Gauge(
            "last_request_timestamp_seconds",
            "Timestamp of the last received request",
            SERVICE_LABELS,
            namespace=NAMESPACE,
            multiprocess_mode="max",
        ),
    )


def _service_labels() -> dict[str, str]:
    """As BentoML labels its series: the Bento's name and version, and the service's name."""
    context = bentoml.server_context
    return {
        "service_name": context.bento_name or "",
        "service_version": context.bento_version or "",
        "runner_name": context.service_name or "",
    }


class RequestMetrics:
    """Counts every HTTP request but /metrics: in progress, then its count and duration by status once answered.

    In BentoML's server each value is a file write (prometheus_client's multiprocess mode): six a request, a third of
    the middlewares' CPU (bench/app_path.py). The count and the duration of each answer are written as it ends, so
    that /metrics, read by whichever worker answers it, has counted every answer already sent. The gauges (requests
    in progress, the last request's time) are written at most once per turn of the event loop, for every request
    that turn began or ended: at load, one write for many requests, at most one turn late."""

    def __init__(self, app: Any, known_paths: Container[str]) -> None:
        self.app = app
        self.known_paths = known_paths
        self.children: dict[tuple[str, str, int], Any] = {}  # (metric, path, status) -> its labelled series
        self.in_progress: dict[str, int] = {}  # by path, as last counted on the loop
        self.changed: set[str] = set()  # the paths whose count the gauges have not been given yet (a flush is due)
        self.last_request: float | None = None  # the time of the last request the gauge has not been given yet

    def _child(self, metric: str, endpoint: str = "", status: int = 0) -> Any:
        key = (metric, endpoint, status)
        found = self.children.get(key)
        if found is None:
            labels = _service_labels()
            if metric != "last_request":
                labels["endpoint"] = endpoint
            if metric in ("total", "duration"):
                labels["http_response_code"] = str(status)
            found = self.children[key] = getattr(request_series(), metric).labels(**labels)
        return found

    def _count(self, endpoint: str, change: int) -> None:
        """A request begun (+1) or ended (-1): its gauge is given the count at the end of this turn of the loop."""
        self.in_progress[endpoint] = self.in_progress.get(endpoint, 0) + change
        if not self.changed:  # the first change of this turn: the flush is not scheduled yet
            asyncio.get_running_loop().call_soon(self._flush_gauges)
        self.changed.add(endpoint)

    def _flush_gauges(self) -> None:
        for endpoint in self.changed:
            self._child("in_progress", endpoint).set(self.in_progress[endpoint])
        self.changed.clear()
        if self.last_request is not None:
            self._child("last_request").set(self.last_request)
            self.last_request = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/metrics":
            return await self.app(scope, receive, send)
        endpoint = scope["path"] if scope["path"] in self.known_paths else UNKNOWN
        if not endpoint.startswith(NOT_TIMESTAMPED):
            self.last_request = time.time()
        started, status = default_timer(), 0

        async def counted_send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                self._child("total", endpoint, status).inc()
                self._child("duration", endpoint, status).observe(max(default_timer() - started, 0))
            await send(message)

        self._count(endpoint, +1)
        try:
            await self.app(scope, receive, counted_send)
        finally:
            self._count(endpoint, -1)


EXPOSITION_TRIES = 3


def _exposition() -> bytes:
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # set by `bentoml serve` for every worker
        return prometheus_client.generate_latest()
    for _ in range(EXPOSITION_TRIES - 1):
        try:
            return _every_workers()
        except FileNotFoundError:
            # A worker's file was removed between the folder's listing and its reading (a worker that ended, or
            # another server sharing BentoML's home clearing the folder as it starts): list it again.
            continue
    return _every_workers()


def _every_workers() -> bytes:
    registry = prometheus_client.CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return prometheus_client.generate_latest(registry)


async def metrics_page(request: Incoming) -> Answer:
    """GET /metrics: Prometheus's text format, read in a thread (it reads a file per worker in multiprocess mode)."""
    return Answer(await run_in_threadpool(_exposition), prometheus_client.CONTENT_TYPE_LATEST)
