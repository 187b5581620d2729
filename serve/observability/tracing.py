"""OpenTelemetry's per-request span, only where someone collects it.

BentoML wraps every request in OpenTelemetry's ASGI middleware whether or not tracing is configured. With no
exporter (BentoML's default) each request still gets a span that is created, filled and thrown away, and every
`send` of the response goes through one more wrapper: 1.2 ms of server CPU per image on the digits model at
c=64 here (docs/benchmarks.md, "Where the model is not the cost"; bench/serve_throughput.py's side
`ours_with_spans`). So where the user's BentoML configuration asks for no traces, the service's own
configuration excludes every URL from tracing (BentoML's `tracing.excluded_urls`, which it hands the
middleware): the middleware then passes each request straight on. Where it configures an exporter and a sample
rate above 0, nothing is excluded and the spans are BentoML's as ever (a user's own `excluded_urls` wins).

What goes without spans: the unsampled trace and span ids in the access log's lines (they point to no trace).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("bentoml.handoff.tracing")

EVERY_URL = ["."]  # a regular expression OpenTelemetry searches each request's URL for


def tracing_configured(exporter_type: str | None, sample_rate: float | None) -> bool:
    """BentoML exports spans only with an exporter and a sample rate above 0 (its default rate is 0)."""
    return bool(exporter_type) and (sample_rate or 0.0) > 0.0


def _tracing_sections(document: Any) -> list[dict[str, Any]]:
    """Every `tracing` mapping in a BentoML configuration, wherever its version puts it (top level,
    `api_server`, a service under `services`)."""
    if not isinstance(document, dict):
        return []
    found = [document["tracing"]] if isinstance(document.get("tracing"), dict) else []
    return found + [
        section for key, value in document.items() if key != "tracing" for section in _tracing_sections(value)
    ]


def _tracing_section(environ: dict[str, str]) -> dict[str, Any]:
    """`tracing` as BentoML's documented configuration sets it: the file BENTOML_CONFIG names, then the
    `...tracing.key=value` items of BENTOML_CONFIG_OPTIONS."""
    section: dict[str, Any] = {}
    if environ.get("BENTOML_CONFIG"):
        try:
            document = yaml.safe_load(Path(environ["BENTOML_CONFIG"]).read_text())
        except (OSError, yaml.YAMLError):
            document = None  # BentoML itself reports an unreadable configuration when it loads it
        for found in _tracing_sections(document):
            section.update(found)
    for item in environ.get("BENTOML_CONFIG_OPTIONS", "").split():
        key, _, value = item.partition("=")
        if "tracing." in key:
            section[key.rpartition("tracing.")[2]] = yaml.safe_load(value) if value else None
    return section


def service_tracing(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The service's `tracing` configuration: every URL excluded, unless the user's configuration traces."""
    section = _tracing_section(dict(os.environ) if environ is None else environ)
    if tracing_configured(section.get("exporter_type"), section.get("sample_rate")):
        return {}
    log.debug("tracing is not configured: no per-request span")
    return {"excluded_urls": EVERY_URL}
