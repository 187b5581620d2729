"""What a checkpoint holds (the contract export reads, see DESIGN.md): its format, keys and meta, and the
RNG states that make a resume exact. Adding a checkpoint field is an edit here and in
`Checkpointer.state` / `Checkpointer.load`."""

from __future__ import annotations

import datetime
import os
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from contract.preprocessing import Preprocessing
from train.checkpoint.errors import CheckpointError

FORMAT = "handoff.checkpoint/1"
EMBEDDED_DIGITS = "embedded:digits"
LAST, BEST = "last.pt", "best.pt"
EPOCH_PATTERN = "epoch_{:04d}.pt"
REQUIRED_KEYS = ("format", "model", "optimizer", "scheduler", "epoch", "step", "best_acc1", "rng", "sampler", "meta")
META_KEYS = (
    "arch",
    "num_classes",
    "classes",
    "image_size",
    "mean",
    "std",
    "resize",
    "interpolation",
    "channels",
    "world_size",
    "torch",
    "created",
)


def capture_rng() -> dict[str, Any]:
    """This process's RNG states, in types `weights_only=True` accepts."""
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(_as_tuple(state["python"]))
    numpy_state = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": "MT19937",
            "state": {"key": numpy_state["key"].numpy().astype(np.uint32), "pos": numpy_state["pos"]},
            "has_gauss": numpy_state["has_gauss"],
            "gauss": numpy_state["gauss"],
        }
    )
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def make_meta(
    arch: str, classes: list[str], preprocessing: Preprocessing, world_size: int, data: str
) -> dict[str, Any]:
    """Everything export needs to rebuild the model and its input pipeline with no flags."""
    return {
        "data": data,  # EMBEDDED_DIGITS or the ImageFolder root: where export finds real images for parity
        "arch": arch,
        "num_classes": len(classes),
        "classes": list(classes),
        **preprocessing.to_meta(),  # image_size, resize, mean, std, interpolation, channels
        "world_size": world_size,
        "torch": str(torch.__version__),  # TorchVersion is a class: weights_only would refuse it
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


_INTERPOLATIONS = ("nearest", "bilinear", "bicubic")


def check_meta(meta: Any, path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's `meta`, checked (keys, types, ranges) before anything is built from it."""

    def bad(key: str, why: str) -> CheckpointError:
        return CheckpointError(f"{path}: meta.{key} {why}")

    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: a handoff checkpoint without its meta (what export rebuilds the model from)")
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise CheckpointError(f"{path}: incomplete meta, missing {', '.join(missing)}")
    if not isinstance(meta["arch"], str) or not meta["arch"]:
        raise bad("arch", f"is {meta['arch']!r}, not an architecture name")
    for key, least in (("num_classes", 1), ("image_size", 8), ("resize", 8)):
        if type(meta[key]) is not int or not least <= meta[key] <= 8192:
            raise bad(key, f"is {meta[key]!r}, not an integer between {least} and 8192")
    if meta["resize"] < meta["image_size"]:
        raise bad("resize", f"{meta['resize']} is smaller than the image size {meta['image_size']}")
    if meta["channels"] != 3:
        raise bad("channels", f"is {meta['channels']!r}; handoff feeds RGB images (3 channels)")
    classes = meta["classes"]
    if (
        not isinstance(classes, list)
        or not all(isinstance(c, str) for c in classes)
        or len(classes) != meta["num_classes"]
    ):
        raise bad("classes", f"must list num_classes={meta['num_classes']} names (strings)")
    for key in ("mean", "std"):
        values = meta[key]
        if (
            not isinstance(values, list)
            or len(values) != 3
            or not all(isinstance(v, (int, float)) for v in values)
            or (key == "std" and min(values) <= 0)
        ):
            raise bad(key, f"is {values!r}, not 3 numbers" + (" above 0" if key == "std" else ""))
    if meta["interpolation"] not in _INTERPOLATIONS:
        raise bad("interpolation", f"is {meta['interpolation']!r}, not one of {', '.join(_INTERPOLATIONS)}")
    if "data" in meta and not isinstance(meta["data"], str):
        raise bad("data", f"is {meta['data']!r}, not a path")
    return meta


@dataclass
class Trainables:
    """The live objects a checkpoint captures and restores."""

    model: nn.Module  # the bare module, never the DDP or compiled wrapper
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler


@dataclass
class Progress:
    """Where training stands."""

    epoch: int  # epochs completed
    step: int  # optimizer steps taken
    best_acc1: float
    sampler_epoch: int  # the epoch the sampler is in, and how many of its samples (over all ranks) are done
    sampler_position: int


def training_state(live: Trainables, progress: Progress, rng: list[dict[str, Any]], meta: dict[str, Any]) -> dict:
    """The checkpoint (see DESIGN.md): every field is written here and read back in `restore_training_state`."""
    ckpt: dict[str, Any] = {
        "format": FORMAT,
        "model": live.model.state_dict(),  # the Checkpointer moves (or copies) it to the CPU
        "optimizer": live.optimizer.state_dict(),
        "scheduler": live.scheduler.state_dict(),
        "epoch": progress.epoch,
        "step": progress.step,
        "best_acc1": float(progress.best_acc1),
        "rng": rng,  # one entry per rank
        "sampler": {"epoch": progress.sampler_epoch, "position": progress.sampler_position},
        "meta": meta,
    }
    if live.scaler.is_enabled():
        ckpt["scaler"] = live.scaler.state_dict()
    return ckpt


def restore_training_state(ckpt: dict[str, Any], live: Trainables, rank: int, world_size: int) -> Progress:
    """Load a checkpoint into the live objects, and this rank's RNG state when the world size is unchanged
    (otherwise the caller reseeds: a rank's RNG state has no meaning in another world)."""
    live.model.load_state_dict(ckpt["model"])  # the bare module, before DDP wraps it
    live.optimizer.load_state_dict(ckpt["optimizer"])
    live.scheduler.load_state_dict(ckpt["scheduler"])
    if "scaler" in ckpt and live.scaler.is_enabled():
        live.scaler.load_state_dict(ckpt["scaler"])
    if len(ckpt["rng"]) == world_size:
        restore_rng(ckpt["rng"][rank])
    return Progress(
        ckpt["epoch"], ckpt["step"], ckpt["best_acc1"], ckpt["sampler"]["epoch"], ckpt["sampler"]["position"]
    )
