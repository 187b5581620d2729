"""A model served as several towers (an image-text model's image and text encoders, Whisper's encoder and decoder):
each tower written and proved as an export of its own, in a folder of the export, and an outer manifest that binds
them, hashing each tower's manifest (whose hashes cover the tower's files), with the towers' verdicts joined and the
task's own checks (the library's calls on the whole model) added. serve/model/towers.py loads them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from contract.image_text import ImageTextSettings
from contract.manifest import MANIFEST, Manifest, Origin, new_tensor_manifest
from contract.pil_transform import Preprocessor
from contract.signature import Signature
from export.job import Job
from export.pipeline import (
    Check,
    ExportRequest,
    OwnChecks,
    add_own_checks,
    close_manifest,
    library_checks,
    tolerance_of,
    write_tensor_export,
)
from export.reference import Reference
from export.tensor_model import Example, describe


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


@dataclass(frozen=True)
class ImageTextTowers:
    """An image-text model's two towers as its source made them (a Hugging Face folder: export/tasks/image_text.py;
    an open_clip checkpoint: export/open_clip.py), and what the outer manifest takes of that source; the task
    assembles the export from it."""

    origin: Origin
    architecture: str
    image: Job
    text: Job
    preprocess: dict[str, Any]
    settings: ImageTextSettings
    reference: Reference
    photos: list[Any]
    files: Callable[[Path], list[str]]
    """the source's own files, copied beside the outer manifest (a processor's config, open_clip's)"""
    fields: dict[str, Any]
    """the source's own manifest section (`hf`, `open_clip`)"""


def zero_shot_settings(model: Any, sigmoid: bool) -> ImageTextSettings:
    """An image-text model's zero-shot settings as loaded: its exponentiated logit scale, its bias (SigLIP's), and a
    sigmoid of each label's logit (`sigmoid`) or a softmax over the labels."""
    bias = float(model.logit_bias.detach().reshape(-1)[0]) if getattr(model, "logit_bias", None) is not None else 0.0
    return ImageTextSettings(float(model.logit_scale.detach().exp()), bias, "sigmoid" if sigmoid else "softmax")


def image_tower(
    request: ExportRequest,
    tower: nn.Module,
    preprocess: dict[str, Any],
    photos: list[Any],
    manifest_of: Callable[[Any, dict[str, tuple[int, ...]]], Manifest],
    check: Callable[[Manifest], Check],
) -> Job:
    """An image tower as an export of its own: `photos` preprocessed as the service does them are its example,
    `manifest_of(signature, dynamic)` its manifest, and `check(manifest)` its source's preprocessing check (the
    service's pixels against the library's), run on the written folder."""
    options = request.options
    served = Preprocessor.from_manifest(preprocess, max_pixels=1 << 40)
    rows = np.stack([served(photo) for photo in photos]).astype(np.float32)
    example = Example({"pixel_values": torch.from_numpy(rows)}, keywords=True)
    dynamic: dict[str, tuple[int, ...]] = {"pixel_values": ()}
    signature, wrapped = describe(tower, example, dynamic)
    manifest = manifest_of(signature, dynamic)
    manifest["preprocess"] = preprocess

    def write(out: Path) -> int:
        own = OwnChecks("image", lambda out: ([], [check(manifest)]))
        formats, tol = options.write.formats, tolerance_of(options)
        return write_tensor_export(wrapped, example, dynamic, formats, request.device, tol, manifest, out, own)

    return Job(manifest, write, "the image tower")
