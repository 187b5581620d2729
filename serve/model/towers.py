"""The runtime of a model served as towers (export/towers.py: an image-text model's image/ and text/, Whisper's
encoder/ and decoder/), each an export of its own inside the served folder, each loaded as any model is, from bytes
its own manifest verifies, that manifest's bytes verified by the served manifest. A batch runs the tower whose inputs
it holds, and gets that tower's outputs by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from contract.manifest import MANIFEST, Manifest, ManifestError, read_artifact
from serve.config import ServeConfig
from serve.model.lanes import Lanes
from serve.model.runtime import Runtime, load_runtime


def tower_manifest(folder: Path, manifest: Manifest, tower: str) -> Manifest:
    """Tower `tower`'s manifest, from bytes the served manifest verifies; its folder never a symbolic link."""
    if (folder / tower).is_symlink() or not (folder / tower).is_dir():
        raise ManifestError(f"{tower}/: not a folder of this export (an export folder holds its own files)")
    return json.loads(read_artifact(folder, manifest, f"{tower}/{MANIFEST}"))


class Towers:
    """Runtime's protocol over the towers' runtimes (the first tower's name, provider and device)."""

    def __init__(self, config: ServeConfig, folder: Path, manifest: Manifest, threads: int) -> None:
        tensorrt = config.tensorrt_cache if config.tensorrt == "1" else None
        manifests = {tower: tower_manifest(folder, manifest, tower) for tower in manifest["towers"]}
        self.towers: dict[str, Runtime] = {
            tower: load_runtime(config.runtime, folder / tower, own, config.device, config.precision, tensorrt, threads)
            for tower, own in manifests.items()
        }
        self.inputs = {tower: {t["name"] for t in own["signature"]["inputs"]} for tower, own in manifests.items()}
        first = next(iter(self.towers))
        runtime = self.towers[first]
        self.name, self.provider, self.device = runtime.name, runtime.provider, runtime.device
        self.artifact = f"{first}/{MANIFEST}"  # what GET /info names: the first tower's manifest, in the served one

    @classmethod
    def arranged(cls, config: ServeConfig, folder: Path, manifest: Manifest, how: str) -> tuple[Lanes, Towers]:
        """The towers on every thread, one lane (`how` they run, for GET /info), as a task's `own_runtime`."""
        threads = config.model_threads()
        return Lanes(1, threads, config.max_batch_size, f"towers: {how}"), cls(config, folder, manifest, threads)

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        raise TypeError("a model of towers runs by its inputs' names (run_named)")

    def run_named(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs of the tower whose inputs `inputs` holds."""
        tower = next(name for name, names in self.inputs.items() if names <= inputs.keys())
        return self.towers[tower].run_named(inputs)

    def info(self) -> dict[str, Any]:
        return {tower: runtime.artifact for tower, runtime in self.towers.items()}
