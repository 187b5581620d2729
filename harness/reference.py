"""The eager model behind an export, rebuilt the way the tests and the demo compare served answers with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.nn as nn

from contract.manifest import read_manifest_unchecked
from contract.preprocessing import Preprocessing
from train.checkpoint import load
from train.models import build_model
from train.presets import eval_transform


def eager_from_export(folder: Path) -> tuple[nn.Module, Any]:
    """(model in eval mode, torchvision evaluation transform) of an export made from a handoff checkpoint,
    the transform built from the manifest's whole `preprocess` block (crop, resize, mean, std, interpolation)."""
    manifest = read_manifest_unchecked(Path(folder))
    model = build_model(manifest["arch"], manifest["num_classes"], manifest["preprocess"]["crop"])
    model.load_state_dict(load(Path(manifest["source"]["checkpoint"]))["model"])
    return model.eval(), eval_transform(Preprocessing.from_manifest(manifest["preprocess"]))
