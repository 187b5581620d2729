"""Checkpoint files, and the containers the field's scripts save: where the weights are inside them.

Files: handoff's own checkpoint; torchvision's classification references (`model`, `args`, `model_ema`);
timm's `train.py` / `CheckpointSaver` (`state_dict`, `arch`, `args`, `state_dict_ema`); the ImageNet
example's `{"arch", "state_dict", ...}`; PyTorch Lightning's `.ckpt`; `{"model": ...}`; a bare state_dict;
a `.safetensors` file; and (with `--trust-pickle` only) a whole pickled `nn.Module`.
Folders (export/readers/folders.py): `torch.distributed.checkpoint` (FSDP2, torchtitan) and Accelerate's `save_state`.

Every tensor is loaded onto the CPU whatever device it was saved from; the device tags found in the
file (`cuda:3`, ...) are recorded for the manifest. EMA weights, where the file has them, are found too:
they are what gets exported with `--ema`.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from contract.manifest import sha256_file
from export.readers.allowlist import FIELD_SAFE_GLOBALS
from train.checkpoint import FORMAT as HANDOFF_FORMAT
from train.checkpoint import CheckpointError, PickleRefused, check_meta, read_weights_only

log = logging.getLogger(__name__)

EMA_KEYS = ("model_ema", "state_dict_ema", "ema_state_dict", "ema", "ema_model", "model_ema_state_dict")


@dataclass
class Source:
    path: Path
    sha256: str
    kind: str  # handoff | torchvision-reference | timm | imagenet-example | lightning | model-dict | state_dict |
    #            safetensors | pickled-module | dcp | accelerate
    state_dict: dict[str, torch.Tensor]
    module: nn.Module | None = None  # a whole pickled model (only with --trust-pickle)
    arch: str | None = None  # as the file names it, in handoff's spelling (timm's models as timm/NAME)
    meta: dict[str, Any] | None = None  # handoff's meta: classes and preprocessing
    preprocess_hints: dict[str, Any] = field(default_factory=dict)  # what the training script's args say
    device_tags: list[str] = field(default_factory=list)  # storage locations found in the file, e.g. cuda:3
    ema_state_dict: dict[str, torch.Tensor] | None = None
    ema_key: str | None = None  # where the EMA weights were found
    ema_chosen: bool = False
    set_aside: list[str] = field(default_factory=list)  # weight files beside the ones read, and why they were not


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


def _args(obj: dict[str, Any]) -> dict[str, Any]:
    """A training script's saved arguments as a dict (a Namespace for torchvision's references and timm)."""
    args = obj.get("args")
    if isinstance(args, argparse.Namespace):
        return vars(args)
    return args if isinstance(args, dict) else {}


def _find_ema(obj: dict[str, Any]) -> tuple[str, dict[str, torch.Tensor]] | None:
    """EMA weights beside the trained ones: torchvision's `model_ema` (an AveragedModel's state, with its
    `n_averaged` counter), timm's `state_dict_ema`, or any other `*ema*` entry holding tensors."""
    keys = [k for k in EMA_KEYS if k in obj] + [
        k for k in obj if isinstance(k, str) and "ema" in k.lower() and k not in EMA_KEYS
    ]
    for key in keys:
        value = obj[key]
        if isinstance(value, dict) and value:
            tensors = {k: v for k, v in _tensors_only(value).items() if k != "n_averaged"}
            if tensors:
                return key, tensors
    return None


def _torchvision_reference_hints(args: dict[str, Any]) -> dict[str, Any]:
    """torchvision's references/classification/train.py: --val-resize-size, --val-crop-size, --interpolation;
    references/detection/train.py's --rpn-score-thresh and references/segmentation/train.py's --aux-loss."""
    hints = {
        "image_size": args.get("val_crop_size"),
        "resize": args.get("val_resize_size"),
        "interpolation": args.get("interpolation"),
        "data": args.get("data_path"),  # its ImageFolder root: train/ and val/
        "rpn_score_thresh": args.get("rpn_score_thresh"),  # references/detection/train.py's, an R-CNN's own setting
        "aux_loss": args.get("aux_loss"),  # references/segmentation/train.py's: the model has an aux classifier
        "min_size": args.get("min_size"),  # a detection script's own: the builder's min_size= and max_size=
        "max_size": args.get("max_size"),
    }
    return {k: v for k, v in hints.items() if v is not None}


def _timm_hints(args: dict[str, Any]) -> dict[str, Any]:
    """timm's train.py: --img-size / --input-size, --crop-pct, --interpolation, --mean, --std (None: the model's)."""
    size = args.get("img_size") or (args.get("input_size") or [None])[-1]
    hints = {
        "image_size": size,
        "crop_pct": args.get("crop_pct"),
        "interpolation": args.get("interpolation") or None,
        "mean": args.get("mean"),
        "std": args.get("std"),
        "data": args.get("data_dir") or args.get("data"),  # its dataset root; the validation split below
        "val_split": args.get("val_split"),
    }
    return {k: v for k, v in hints.items() if v is not None}


def _timm_arch(name: Any) -> str | None:
    """timm's `arch` is a timm model name: spelled timm/NAME here, so a name torchvision shares stays timm's."""
    if not isinstance(name, str):
        return None
    from train.models import TIMM_PREFIX, timm_has

    return TIMM_PREFIX + name if timm_has(name) else name


def _from_container(obj: Any, src: Source) -> Source:
    if isinstance(obj, nn.Module):
        src.kind, src.module = "pickled-module", unwrap_module(obj)
        src.state_dict = src.module.state_dict()
        return src
    if not isinstance(obj, dict):
        raise CheckpointError(f"{src.path}: holds a {type(obj).__name__}, not a checkpoint or state_dict")
    if obj.get("format") == HANDOFF_FORMAT:
        if not isinstance(obj.get("model"), dict):
            raise CheckpointError(f"{src.path}: a handoff checkpoint without its 'model' weights")
        src.kind, src.state_dict, src.meta = "handoff", obj["model"], check_meta(obj.get("meta"), src.path)
        src.arch = src.meta["arch"]
        return src
    ema = _find_ema(obj)
    if ema is not None:
        src.ema_key, src.ema_state_dict = ema
    args = _args(obj)
    if "state_dict" in obj and ("pytorch-lightning_version" in obj or "hyper_parameters" in obj):
        src.kind, src.state_dict = "lightning", _tensors_only(obj["state_dict"])
        hp = obj.get("hyper_parameters")
        hp = dict(hp) if isinstance(hp, dict) else vars(hp) if isinstance(hp, argparse.Namespace) else {}
        arch = hp.get("arch") or hp.get("model_name") or hp.get("model")
        src.arch = arch if isinstance(arch, str) else None
        src.preprocess_hints = {k: hp[k] for k in ("image_size",) if isinstance(hp.get(k), int)}
        return src
    if "state_dict" in obj and ("version" in obj or "state_dict_ema" in obj or "saver" in obj) and "arch" in obj:
        src.kind, src.state_dict = "timm", _tensors_only(obj["state_dict"])
        src.arch = _timm_arch(obj["arch"])
        src.preprocess_hints = _timm_hints(args)
        return src
    if "model" in obj and isinstance(obj["model"], dict) and isinstance(args.get("model"), str):
        src.kind, src.state_dict = "torchvision-reference", _tensors_only(obj["model"])
        src.arch = args["model"]
        src.preprocess_hints = _torchvision_reference_hints(args)
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
    raise CheckpointError(
        f"{src.path}: found no weights (top-level keys: {keys}); expected a state_dict, "
        "'state_dict', 'model', or a handoff checkpoint"
    )


def choose_weights(src: Source, ema: bool) -> Source:
    """Make `src.state_dict` the trained weights, or with `ema` the EMA weights (CheckpointError if none)."""
    if ema:
        if src.ema_state_dict is None:
            raise CheckpointError(
                f"--ema: {src.path} holds no EMA weights (looked for {', '.join(EMA_KEYS)} and "
                "any other *ema* entry); drop --ema to export the trained weights"
            )
        log.info("exporting the EMA weights (%s)", src.ema_key)
        src.state_dict, src.ema_chosen = src.ema_state_dict, True
    elif src.ema_state_dict is not None:
        log.info(
            "%s also holds EMA weights (%s); exporting the trained weights, pass --ema for those",
            src.path.name,
            src.ema_key,
        )
    return src


def read_file(path: Path, trust_pickle: bool = False) -> Source:
    """A checkpoint file saved by torch.save, loaded on the CPU (weights only unless `trust_pickle`)."""
    recorder = _DeviceTagRecorder()
    try:
        obj = read_weights_only(path, map_location=recorder, safe_globals=FIELD_SAFE_GLOBALS)
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


def read_safetensors(path: Path, kind: str = "safetensors") -> Source:
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    if path.exists() and not path.is_file():
        raise CheckpointError(f"{path}: not a regular file (a FIFO, device or socket, or a link to one)")
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        state = load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path}: not a readable safetensors file ({str(err).splitlines()[0][:160]})") from None
    return Source(path, sha256_file(path), kind, state, arch=metadata.get("arch"))
