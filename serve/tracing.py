"""OpenTelemetry's per-request span, only where someone collects it.

BentoML wraps every request in OpenTelemetry's ASGI middleware whether or not tracing is configured. With no
exporter (BentoML's default: `tracing.sample_rate` unset, i.e. 0) each request still gets a span that is
created, filled and thrown away, and every `send` of the response goes through one more wrapper: 1.2 ms of
server CPU per image on the digits model at c=64 here, 4.0 against 2.8 ms (docs/benchmarks.md, "Where the
model is not the cost", with the A/B command; bench/serve_throughput.py's side `ours_with_spans`). When
tracing is configured (an exporter and a sample rate above 0), the middleware stays as BentoML builds it.

What goes without it: the unsampled trace and span ids in the access log's lines (they point to no trace).
The access log, metrics, limits and every other middleware are untouched. Like serve/request_metrics.py this
replaces a class BentoML looks up when it builds the app (bentoml is pinned exactly in pyproject.toml).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("bentoml.handoff.tracing")


def tracing_configured(exporter_type: str | None, sample_rate: float | None) -> bool:
    """BentoML exports spans only with an exporter and a sample rate above 0 (its default rate is 0)."""
    return bool(exporter_type) and (sample_rate or 0.0) > 0.0


class _NoSpan:
    """Stands in for OpenTelemetryMiddleware: hands the request straight to the app."""

    def __init__(self, app: Any, **_: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


def skip_unexported_spans() -> None:
    """Leave OpenTelemetry's middleware out of the app BentoML builds, unless tracing is configured."""
    from bentoml._internal.configuration.containers import BentoMLContainer
    from opentelemetry.instrumentation import asgi

    tracing = BentoMLContainer.config.tracing
    if tracing_configured(tracing.exporter_type.get(), tracing.sample_rate.get()):
        return
    asgi.OpenTelemetryMiddleware = _NoSpan  # type: ignore[misc, assignment]  # BentoML imports it when building
    log.debug("tracing is not configured: no per-request span")
