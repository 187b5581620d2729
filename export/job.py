"""What one export is: its manifest, how its artifacts are written and checked, and its name in the last line;
and the manifest's account of where the weights came from, which every kind of export records alike."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from contract.manifest import Manifest, Origin, SourceSection
from export.provenance import Provenance
from export.readers.containers import Source
from export.readers.folder_files import account_for
from export.unwrap import Unwrapped

log = logging.getLogger("export")


@dataclass(frozen=True)
class Job:
    """One export: its manifest, how to write and check the artifacts into a folder (returning the exit status),
    and how the result is named in the last line."""

    manifest: Manifest
    write: Callable[[Path], int]
    described: str


def origin_fields(checkpoint: Path, src: Source, unwrapped: Unwrapped, provenance: Provenance) -> Origin:
    """The manifest's `source` (where the weights came from and what was done to read them) and `provenance`
    (export/provenance.py: every tensor of the exported model traced to the checkpoint)."""
    source: SourceSection = {
        "checkpoint": str(checkpoint.resolve()),
        "sha256": src.sha256,
        "container": src.kind,
        "weights": f"EMA ({src.ema_key})" if src.ema_chosen else "trained",
        "removed_prefixes": unwrapped.removed,
        "ignored_keys": unwrapped.ignored[:20],
        "device_tags": [t for t in src.device_tags if t != "cpu"],
        "set_aside": src.set_aside,
    }
    if checkpoint.is_dir():
        source["files"] = account_for(checkpoint, src.set_aside)
    return {"source": source, "provenance": provenance.to_manifest()}


def log_loading(src: Source, unwrapped: Unwrapped) -> None:
    if unwrapped.removed:
        log.info("removed wrapper prefixes: %s", ", ".join(unwrapped.removed))
    if src.device_tags and src.device_tags != ["cpu"]:
        log.info("tensors saved on %s, loaded on the CPU", ", ".join(src.device_tags))
