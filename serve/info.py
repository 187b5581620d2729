"""GET /info: what the service serves (the model, its signature, where it came from, how it passed parity; the
task adds its own fields) and on what (runtime, precision, device, batching, CPU threads, the protocol's endpoints).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from serve.endpoint import Endpoint
    from serve.service import ModelService


def _source(manifest: dict[str, Any], show_paths: bool) -> dict[str, Any]:
    """Where the weights came from; absolute paths only with HANDOFF_SHOW_PATHS=1 (they show the host's layout)."""
    source = dict(manifest["source"])
    if not show_paths:
        source["checkpoint"] = Path(source["checkpoint"]).name
    return source


def service_info(
    service: ModelService, version: str, protocol: dict[str, Any], routes: list[Endpoint]
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
            {"method": e.method, "path": e.path, "accepts": sorted(e.body.media_types) if e.body else []}
            for e in routes
        ],
        "protocol": protocol,
    }
