"""Register an export folder in the BentoML model store, so `bentoml serve` finds it without a path."""

from __future__ import annotations

import shutil
from pathlib import Path

from contract.manifest import Manifest

DEFAULT_NAME = "handoff"


def register(folder: Path, manifest: Manifest, name: str = DEFAULT_NAME) -> str:
    """Copy the export folder into a new model version; returns its tag (name:version)."""
    import bentoml

    labels = {"arch": manifest["arch"], "task": manifest.get("task", "image-classification")}
    if "num_classes" in manifest:
        labels["num_classes"] = str(manifest["num_classes"])
    metadata = {"manifest_format": manifest["format"], "source_sha256": manifest["source"]["sha256"]}
    with bentoml.models.create(name, labels=labels, metadata=metadata) as model:
        for item in folder.iterdir():  # a language model's export holds folders (hf/, genai/)
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, Path(model.path) / item.name)
    return str(model.tag)
