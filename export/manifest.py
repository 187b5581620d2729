"""The export folder's manifest: the one description serve trusts (see DESIGN.md).

Plain Python and JSON on purpose: the serving path imports this module and must not need torch.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

MANIFEST_FORMAT = "handoff.manifest/1"
MANIFEST = "manifest.json"
ONNX, ONNX_DATA, TORCHSCRIPT, SAFETENSORS = "model.onnx", "model.onnx.data", "model.torchscript.pt", "model.safetensors"
FORMATS = {"onnx": ONNX, "torchscript": TORCHSCRIPT, "safetensors": SAFETENSORS}
# The manifest fields the ONNX file carries too (its metadata_props), so it describes itself alone.
EMBEDDED_FIELDS = ("format", "arch", "num_classes", "classes", "input", "preprocess")


class ManifestError(Exception):
    """A manifest or artifact that must not be served, with a one-line reason."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def describe_artifacts(folder: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    return {name: {"sha256": sha256_file(folder / name), "bytes": (folder / name).stat().st_size} for name in names}


def preprocess_from_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """The manifest's `preprocess` block from a training checkpoint's `meta` (same names, crop = image_size)."""
    return {
        "resize": int(meta["resize"]),
        "crop": int(meta["image_size"]),
        "mean": [float(v) for v in meta["mean"]],
        "std": [float(v) for v in meta["std"]],
        "interpolation": str(meta["interpolation"]),
        "channels": int(meta["channels"]),
    }


def embedded_fields(manifest: dict[str, Any]) -> dict[str, str]:
    """Manifest fields as ONNX metadata_props (string values; JSON where not a string)."""
    return {
        f"handoff.{key}": value if isinstance(value, str) else json.dumps(value)
        for key, value in manifest.items()
        if key in EMBEDDED_FIELDS
    }


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def read_manifest(folder: Path) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise ManifestError(f"{path}: no manifest; is this an export folder written by `python -m export`?")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ManifestError(f"{path}: not valid JSON ({err})") from None
    if manifest.get("format") != MANIFEST_FORMAT:
        raise ManifestError(f"{path}: format {manifest.get('format')!r}, expected {MANIFEST_FORMAT!r}")
    if manifest.get("status") != "passed":
        raise ManifestError(f"{path}: export status is {manifest.get('status')!r}: parity did not pass")
    return manifest


def verify_artifacts(folder: Path, manifest: dict[str, Any], names: list[str] | None = None) -> None:
    """Raise ManifestError naming the first artifact whose bytes differ from the manifest's sha256."""
    for name, expected in manifest["artifacts"].items():
        if names is not None and name not in names:
            continue
        path = Path(folder) / name
        if not path.is_file():
            raise ManifestError(f"{path}: listed in the manifest but missing")
        actual = sha256_file(path)
        if actual != expected["sha256"]:
            raise ManifestError(f"{path}: sha256 {actual[:12]}… does not match the manifest's {expected['sha256'][:12]}…")
