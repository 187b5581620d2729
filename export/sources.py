"""Read any checkpoint a user is likely to hold and find the weights inside it.

Containers recognised: handoff's own checkpoint, the ImageNet example's `{"arch", "state_dict", ...}`,
PyTorch Lightning's `.ckpt`, `{"model": ...}`, a bare state_dict, a `.safetensors` file, and (with
`--trust-pickle` only) a whole pickled `nn.Module`, DataParallel/DDP/compiled wrappers included.

Every tensor is loaded onto the CPU whatever device it was saved from; the device tags found in the
file (`cuda:3`, ...) are recorded for the manifest.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from export.manifest import sha256_file
from train.checkpoint import FORMAT as HANDOFF_FORMAT
from train.checkpoint import CheckpointError, PickleRefused, read_weights_only

log = logging.getLogger(__name__)


@dataclass
class Source:
    path: Path
    sha256: str
    kind: str  # handoff | imagenet-example | lightning | model-dict | state_dict | safetensors | pickled-module
    state_dict: dict[str, torch.Tensor]
    module: nn.Module | None = None  # a whole pickled model (only with --trust-pickle)
    arch: str | None = None  # as the file names it, if it does
    meta: dict[str, Any] | None = None  # handoff's meta: classes and preprocessing
    hyper_parameters: dict[str, Any] | None = None  # Lightning's
    device_tags: list[str] = field(default_factory=list)  # storage locations found in the file, e.g. cuda:3


class _DeviceTagRecorder:
    """A map_location that keeps every storage on the CPU and remembers where it was saved from."""

    def __init__(self) -> None:
        self.tags: set[str] = set()

    def __call__(self, storage: Any, location: str) -> Any:
        self.tags.add(location)
        return storage


def unwrap_module(module: nn.Module) -> nn.Module:
    """The bare model inside DataParallel / DistributedDataParallel / torch.compile wrappers."""
    while True:
        if isinstance(module, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            module = module.module
        elif hasattr(module, "_orig_mod") and isinstance(module._orig_mod, nn.Module):
            module = module._orig_mod
        else:
            return module


def _is_state_dict(obj: Any) -> bool:
    return isinstance(obj, dict) and len(obj) > 0 and all(isinstance(v, torch.Tensor) for v in obj.values())


def _tensors_only(obj: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}


def _from_container(obj: Any, src: Source) -> Source:
    if isinstance(obj, nn.Module):
        src.kind, src.module = "pickled-module", unwrap_module(obj)
        src.state_dict = src.module.state_dict()
        return src
    if not isinstance(obj, dict):
        raise CheckpointError(f"{src.path}: holds a {type(obj).__name__}, not a checkpoint or state_dict")
    if obj.get("format") == HANDOFF_FORMAT:
        src.kind, src.state_dict, src.meta = "handoff", obj["model"], obj["meta"]
        src.arch = src.meta.get("arch")
        return src
    if "state_dict" in obj and ("pytorch-lightning_version" in obj or "hyper_parameters" in obj):
        src.kind, src.state_dict = "lightning", _tensors_only(obj["state_dict"])
        hp = obj.get("hyper_parameters")
        src.hyper_parameters = dict(hp) if isinstance(hp, dict) else None
        src.arch = (src.hyper_parameters or {}).get("arch")
        return src
    if "state_dict" in obj and isinstance(obj["state_dict"], (dict, nn.Module)):
        inner = _from_container(obj["state_dict"], Source(src.path, src.sha256, "state_dict", {}))
        src.kind, src.state_dict, src.module = "imagenet-example", inner.state_dict, inner.module
        src.arch = obj.get("arch") if isinstance(obj.get("arch"), str) else None
        return src
    if "model" in obj and isinstance(obj["model"], (dict, nn.Module)):
        inner = _from_container(obj["model"], Source(src.path, src.sha256, "state_dict", {}))
        src.kind, src.state_dict, src.module = "model-dict", inner.state_dict, inner.module
        src.arch = obj.get("arch") if isinstance(obj.get("arch"), str) else None
        return src
    if _is_state_dict(obj):
        src.kind, src.state_dict = "state_dict", obj
        return src
    keys = ", ".join(sorted(map(str, obj))[:8])
    raise CheckpointError(f"{src.path}: found no weights (top-level keys: {keys}); expected a state_dict, "
                          "'state_dict', 'model', or a handoff checkpoint")


def read_source(path: str | Path, trust_pickle: bool = False) -> Source:
    """Load `path` on the CPU and locate its weights, or raise CheckpointError with a one-line reason."""
    path = Path(path)
    if path.suffix == ".safetensors":
        return _read_safetensors(path)
    recorder = _DeviceTagRecorder()
    try:
        obj = read_weights_only(path, map_location=recorder)
    except PickleRefused as err:
        if not trust_pickle:
            raise CheckpointError(f"{err}; if you trust this file, rerun with --trust-pickle") from None
        log.warning("%s: unpickling with weights_only=False because --trust-pickle was given", path)
        obj = torch.load(path, map_location=recorder, weights_only=False)
    src = _from_container(obj, Source(path, sha256_file(path), "", {}))
    src.device_tags = sorted(recorder.tags)
    if not src.state_dict:
        raise CheckpointError(f"{path}: the {src.kind} container holds no tensors")
    return src


def _read_safetensors(path: Path) -> Source:
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        state = load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path}: not a readable safetensors file ({str(err).splitlines()[0][:160]})") from None
    return Source(path, sha256_file(path), "safetensors", state, arch=metadata.get("arch"))
