"""An image-text model's runtime: its two towers, each an export of its own inside the served folder (image/, text/),
each loaded as any model is, from bytes its own manifest verifies, that manifest's bytes verified by the served
manifest. A batch of images runs the image tower, a batch of texts the text tower; both answer `embeddings`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from contract.image_text import TOWERS
from contract.manifest import MANIFEST, Manifest, ManifestError, read_artifact
from serve.config import ServeConfig
from serve.model.runtime import Runtime, load_runtime

IMAGE_INPUTS = "pixel_values"  # a batch holding it is the image tower's


def tower_manifest(folder: Path, manifest: Manifest, tower: str) -> Manifest:
    """Tower `tower`'s manifest, from bytes the served manifest verifies; its folder never a symbolic link."""
    if (folder / tower).is_symlink() or not (folder / tower).is_dir():
        raise ManifestError(f"{tower}/: not a folder of this export (an export folder holds its own files)")
    return json.loads(read_artifact(folder, manifest, f"{tower}/{MANIFEST}"))


class Towers:
    """Runtime's protocol over the two towers' runtimes."""

    def __init__(self, config: ServeConfig, folder: Path, manifest: Manifest, threads: int) -> None:
        tensorrt = config.tensorrt_cache if config.tensorrt == "1" else None
        self.towers: dict[str, Runtime] = {
            tower: load_runtime(
                config.runtime,
                folder / tower,
                tower_manifest(folder, manifest, tower),
                config.device,
                config.precision,
                tensorrt,
                threads,
            )
            for tower in TOWERS
        }
        image = self.towers["image"]
        self.name, self.provider, self.device = image.name, image.provider, image.device
        self.artifact = (
            f"image/{MANIFEST}"  # what GET /info names: the image tower's manifest, hashed in the served one
        )

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        return self.run_named({IMAGE_INPUTS: batch})["embeddings"]

    def run_named(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tower = "image" if IMAGE_INPUTS in inputs else "text"
        (embeddings,) = self.towers[tower].run_named(inputs).values()
        return {"embeddings": embeddings}

    def info(self) -> dict[str, Any]:
        return {tower: runtime.artifact for tower, runtime in self.towers.items()}
