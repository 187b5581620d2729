"""A model served as several towers (an image-text model's image and text encoders, Whisper's encoder and decoder):
each tower written and proved as an export of its own, in a folder of the export, and an outer manifest that binds
them, hashing each tower's manifest (whose hashes cover the tower's files), with the towers' verdicts joined and the
task's own checks (the library's calls on the whole model) added. serve/model/towers.py loads them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from contract.manifest import MANIFEST, Manifest, Origin, new_tensor_manifest
from contract.signature import Signature
from export.job import Job
from export.pipeline import Check, ExportRequest, add_own_checks, close_manifest, library_checks


def towers_manifest(
    request: ExportRequest, origin: Origin, architecture: str, towers: dict[str, Job], task: str
) -> Manifest:
    """The outer manifest of `towers` (by folder name): their signatures joined (what one tower gives another, as
    Whisper's encoder its states to the decoder, is neither), the checkpoint's `origin` (export/job.py), `task`."""
    signatures = [tower.manifest["signature"] for tower in towers.values()]
    inputs = [tensor for s in signatures for tensor in s["inputs"]]
    outputs = [tensor for s in signatures for tensor in s["outputs"]]
    passed = {t["name"] for t in inputs} & {t["name"] for t in outputs}
    outer = {"inputs": [t for t in inputs if t["name"] not in passed]}
    signature = Signature.from_dict(outer | {"outputs": [t for t in outputs if t["name"] not in passed]})
    dynamic = {name: dims for tower in towers.values() for name, dims in tower.manifest["dynamic"].items()}
    manifest = new_tensor_manifest(architecture, signature, dynamic, origin, request.timings)
    manifest["task"] = task
    manifest["towers"] = {name: name for name in towers}
    return manifest


def write_towers(
    out: Path,
    manifest: Manifest,
    towers: dict[str, Job],
    key: str,
    checks: Callable[[Path], list[Check]],
    files: Callable[[Path], list[str]] = lambda out: [],
) -> int:
    """Each tower written into its folder of `out`, then `files(out)` (the task's own: a processor's config...), the
    towers' verdicts joined and the task's `checks` of the written export (under `key`); the outer manifest closed."""
    for name, tower in towers.items():
        (out / name).mkdir()
        tower.write(out / name)
    manifest["parity"] = joined_parity({name: tower.manifest for name, tower in towers.items()})
    own = files(out)
    add_own_checks(manifest["parity"], key, library_checks(lambda: checks(out)))
    return close_manifest(manifest, out, [*(f"{name}/{MANIFEST}" for name in towers), *own])


def joined_parity(towers: dict[str, Manifest]) -> dict[str, Any]:
    """The outer manifest's parity: the towers' verdicts and tables, each line named by its tower."""
    verdicts = [manifest["parity"]["pass"] for manifest in towers.values()]
    passed = False if False in verdicts else None if None in verdicts else True
    summary = [f"{name}: {line}" for name, manifest in towers.items() for line in manifest["parity"]["summary"]]
    device = next(iter(towers.values()))["parity"]["device"]
    parities = {name: m["parity"] for name, m in towers.items()}
    return {"pass": passed, "device": device, "summary": summary, "towers": parities}
