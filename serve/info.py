"""GET /info: what the service serves (the model, its signature, where it came from, how it passed parity) and on
what (runtime, precision, device, batching, CPU threads, the protocol's endpoints)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from export.manifest import fast_decode_checked
from export.signature import (
    TASK_IMAGE_CLASSIFICATION,
    TASK_OBJECT_DETECTION,
    TASK_SEMANTIC_SEGMENTATION,
    TASK_TEXT_CLASSIFICATION,
)
from serve.config import ServeConfig


def _source(manifest: dict[str, Any], show_paths: bool) -> dict[str, Any]:
    """Where the weights came from; absolute paths only with HANDOFF_SHOW_PATHS=1 (they show the host's layout)."""
    source = dict(manifest["source"])
    if not show_paths:
        source["checkpoint"] = Path(source["checkpoint"]).name
    return source


def service_info(service: Any, config: ServeConfig, version: str, protocol: dict[str, Any]) -> dict[str, Any]:
    """What is being served, and on what (GET /info): `service` is the service instance."""
    if service.unready is not None:
        return {"ready": False, "reason": service.unready, "version": version}
    m = service.manifest
    model: dict[str, Any] = {"arch": m["arch"], "task": service.task, "signature": service.signature.to_dict()}
    if service.task == TASK_IMAGE_CLASSIFICATION:
        model |= {k: m[k] for k in ("num_classes", "classes", "input", "preprocess")}
        model["decode"] = {"setting": config.decode, "fast_jpeg": service.fast_decode, "check": fast_decode_checked(m)}
    else:
        model["dynamic"] = m.get("dynamic", {})
    if service.task == TASK_TEXT_CLASSIFICATION:
        model |= {"labels": m["labels"], "tokenizer": m["tokenizer"]}
    if service.task == TASK_OBJECT_DETECTION:
        model |= {"labels": m["labels"], "detection": m["detection"]}
    if service.task == TASK_SEMANTIC_SEGMENTATION:
        model |= {"labels": m["labels"], "segmentation": m["segmentation"]}
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
            "max_latency_ms": config.max_latency_ms,
            "padded_to": service.padded_batch_sizes(),
        },
        "cpu": {"workers": config.workers, "model_threads": service.model_threads},
        "protocol": protocol,
    }
