"""GET /info: what the service serves (the model, its signature, where it came from, how it passed parity; the
task adds its own fields) and on what (runtime, precision, device, batching, CPU threads, the protocol's endpoints).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from contract.manifest import Manifest
from serve.config import ServeConfig
from serve.http.endpoint import Endpoint
from serve.model.lanes import Lanes
from serve.model.runtime import Runtime
from serve.tasks.base import ServedTask


class DescribedService(Protocol):
    """What GET /info reads of the running service (serve/service.py's ModelService)."""

    @property
    def unready(self) -> str | None: ...

    @property
    def config(self) -> ServeConfig: ...

    @property
    def manifest(self) -> Manifest: ...

    @property
    def folder(self) -> Path: ...

    @property
    def task(self) -> ServedTask: ...

    @property
    def lanes(self) -> Lanes | None: ...

    @property
    def runtime(self) -> Runtime: ...

    def padded_batch_sizes(self) -> list[int] | None: ...


def _source(manifest: Manifest, show_paths: bool) -> dict[str, Any]:
    """Where the weights came from; absolute paths only with HANDOFF_SHOW_PATHS=1 (they show the host's layout)."""
    source: dict[str, Any] = dict(manifest["source"])
    if not show_paths:
        source["checkpoint"] = Path(source["checkpoint"]).name
    return source


def service_info(
    service: DescribedService, version: str, protocol: dict[str, Any], routes: list[Endpoint]
) -> dict[str, Any]:
    """What is being served, and on what (GET /info); `routes`: the served task's, which the page offers."""
    if service.unready is not None:
        return {"ready": False, "reason": service.unready, "version": version}
    config, m, task, lanes = service.config, service.manifest, service.task, service.lanes
    assert lanes is not None  # chosen at load, which a ready service has passed
    model: dict[str, Any] = {"arch": m["arch"], "task": task.name, "kind": task.kind}
    model["signature"] = task.signature.to_dict()
    model |= task.info()
    model |= {
        "source": _source(m, config.show_paths),
        "parity": {"pass": m["parity"]["pass"], "device": m["parity"]["device"]},
        "sha256": m["artifacts"][service.runtime.artifact]["sha256"],
        "folder": str(service.folder) if config.show_paths else service.folder.name,
    }
    return {
        "ready": True,
        "version": version,
        "model": model,
        "runtime": service.runtime.name,
        "precision": config.precision,
        "provider": service.runtime.provider,
        "device": service.runtime.device,
        "batching": {
            "max_batch_size": config.max_batch_size,
            "batches_up_to": lanes.max_batch_size,
            "max_latency_ms": config.max_latency_ms,
            "padded_to": service.padded_batch_sizes(),
        },
        "cpu": {"workers": config.workers, **lanes.describe()},
        "routes": [
            {
                "method": e.method,
                "path": e.path,
                "accepts": sorted(e.body.media_types) if e.body else [],
                "fields": sorted(e.body.form_fields) if e.body else [],  # a form's: the page asks for what it takes
            }
            for e in routes
        ],
        "protocol": protocol,
    }
