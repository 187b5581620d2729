"""Checkpoints in the shapes found in the wild, built with the real wrappers (no hand-written prefixes)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision

ARCH, CLASSES, SIZE = "resnet18", 7, 32


def fresh_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = torchvision.models.get_model(ARCH, weights=None, num_classes=CLASSES)
    # Non-trivial BatchNorm statistics, so a mix-up of buffers would show in parity.
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return model.eval()


@contextlib.contextmanager
def single_process_group():
    """A real 1-process gloo group, so DistributedDataParallel can wrap a model here."""
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def ddp_state_dict(model: nn.Module) -> dict:
    with single_process_group():
        return nn.parallel.DistributedDataParallel(model).state_dict()


_FAKE_CUDA = {"on": False}


def _tag_as_cuda3(storage) -> str | None:
    return "cuda:3" if _FAKE_CUDA["on"] and storage.device.type == "cpu" else None


torch.serialization.register_package(1, _tag_as_cuda3, lambda obj, location: None)


def save_as_if_on_cuda3(obj, path: Path) -> None:
    """torch.save with every storage tagged `cuda:3`: byte for byte what a save from that GPU records."""
    _FAKE_CUDA["on"] = True
    try:
        torch.save(obj, path)
    finally:
        _FAKE_CUDA["on"] = False


class RunsACommand:
    """A pickle that runs a shell command when unpickled with weights_only=False."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def build_all(folder: Path) -> dict[str, Path]:
    """Every checkpoint shape the exporter promises to read, each holding fresh_model()'s weights."""
    model = fresh_model()
    bare = model.state_dict()
    files: dict[str, Path] = {}

    def save(name: str, obj) -> None:
        files[name] = folder / name
        torch.save(obj, files[name])

    save("bare.pth", bare)
    save("ddp.pth", ddp_state_dict(fresh_model()))
    save("dataparallel.pth", nn.DataParallel(fresh_model()).state_dict())
    save("compiled.pth", torch.compile(fresh_model()).state_dict())
    save("compiled_ddp.pth", torch.compile(_ddp_wrapped(fresh_model())).state_dict())
    save("ddp_compiled.pth", _ddp_state_of_compiled())
    partly = fresh_model()
    partly.layer1 = nn.DataParallel(partly.layer1)  # only a submodule wrapped: `layer1.module.0...`
    save("submodule_wrapped.pth", partly.state_dict())
    save("model_key.pth", {"model": bare, "epoch": 3})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    save(
        "imagenet_example.pth.tar",
        {  # what the ImageNet example's save_checkpoint writes
            "epoch": 90,
            "arch": ARCH,
            "state_dict": nn.DataParallel(fresh_model()).state_dict(),
            "best_acc1": torch.tensor(71.2),
            "optimizer": optimizer.state_dict(),
            "scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 30).state_dict(),
        },
    )
    lightning = {f"model.{k}": v for k, v in bare.items()}
    lightning["criterion.weight"] = torch.ones(CLASSES)  # a LightningModule's own, non-model state
    save(
        "lightning.ckpt",
        {
            "epoch": 4,
            "global_step": 400,
            "pytorch-lightning_version": "2.4.0",
            "state_dict": lightning,
            "hyper_parameters": {"arch": ARCH, "num_classes": CLASSES},
            "optimizer_states": [],
            "lr_schedulers": [],
        },
    )
    files["cuda3.pth"] = folder / "cuda3.pth"
    save_as_if_on_cuda3(ddp_state_dict(fresh_model()), files["cuda3.pth"])
    from safetensors.torch import save_file

    files["weights.safetensors"] = folder / "weights.safetensors"
    save_file({k: v.contiguous() for k, v in bare.items()}, str(files["weights.safetensors"]))
    save("pickled_dataparallel.pt", nn.DataParallel(fresh_model()))
    return files


def _ddp_wrapped(model: nn.Module) -> nn.Module:
    """DDP needs a live group only to construct and broadcast; its state_dict is plain afterwards."""
    with single_process_group():
        return nn.parallel.DistributedDataParallel(model)


def _ddp_state_of_compiled() -> dict:
    with single_process_group():
        return nn.parallel.DistributedDataParallel(torch.compile(fresh_model())).state_dict()


# --- checkpoints as the field's training scripts write them -----------------------------------------

TIMM_ARCH = "resnet18d"  # a timm-native model: torchvision has no resnet18d


def _ema_of(model: nn.Module) -> nn.Module:
    """An EMA copy that differs from the trained weights, as after some training steps."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ema.update_parameters(model)
    return ema


def image_folder(root: Path, split: str, per_class: int = 3) -> Path:
    """An ImageFolder dataset root holding `split`/ with two classes of real photo crops (scikit-learn's)."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    for index, photo in enumerate(load_sample_images().images):
        folder = root / split / f"class{index}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(photo).crop((40 * i, 30 * i, 40 * i + 200, 30 * i + 160)).save(folder / f"{i}.jpg")
    return root


def torchvision_reference(folder: Path) -> tuple[Path, dict, dict]:
    """torchvision's references/classification/train.py: its exact save call (the script is not a package).
    Returns (path, trained state, EMA state)."""
    import argparse

    import numpy as np

    model = fresh_model()
    model_ema = _ema_of(model)  # the references' ExponentialMovingAverage is an AveragedModel
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 30)
    scaler = torch.amp.GradScaler("cpu")
    args = argparse.Namespace(
        model=ARCH,
        epochs=90,
        lr=np.float64(0.5),
        batch_size=32,
        val_resize_size=36,
        val_crop_size=SIZE,
        train_crop_size=SIZE,
        interpolation="bilinear",
        model_ema=True,
        model_ema_decay=0.99998,
        output_dir=str(folder),
        distributed=True,
        world_size=8,
        data_path=str(image_folder(folder / "imagenet", "val")),  # parity runs on its val/ images
    )
    checkpoint = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "lr_scheduler": lr_scheduler.state_dict(),
        "epoch": 89,
        "args": args,
    }
    checkpoint["model_ema"] = model_ema.state_dict()
    checkpoint["scaler"] = scaler.state_dict()
    path = folder / "model_89.pth"
    torch.save(checkpoint, path)
    ema_state = {k.removeprefix("module."): v for k, v in model_ema.state_dict().items() if k != "n_averaged"}
    return path, model.state_dict(), ema_state


def timm_checkpoint(folder: Path) -> tuple[Path, dict, dict]:
    """timm's own CheckpointSaver and ModelEmaV3, as its train.py uses them, on a timm-native model."""
    import argparse

    import numpy as np
    import timm
    from timm.utils import CheckpointSaver, ModelEmaV3

    torch.manual_seed(1)
    model = timm.create_model(TIMM_ARCH, pretrained=False, num_classes=CLASSES).eval()
    ema = ModelEmaV3(model, decay=0.9)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ema.update(model)
    optimizer = torch.optim.AdamW(model.parameters())
    args = argparse.Namespace(
        model=TIMM_ARCH,
        img_size=64,
        input_size=None,
        crop_pct=None,
        interpolation="",
        mean=None,
        std=None,
        num_classes=CLASSES,
        lr=np.float64(1e-3),
        epochs=np.int64(300),
        data_dir=str(image_folder(folder / "timm_data", "validation")),  # parity runs on its validation split
        val_split="validation",
    )
    saver = CheckpointSaver(
        model, optimizer, args=args, model_ema=ema, checkpoint_dir=str(folder), recovery_dir=str(folder), max_history=2
    )
    saver.save_checkpoint(epoch=0, metric=np.float64(71.5))
    return folder / "model_best.pth.tar", model.state_dict(), ema.module.state_dict()


def accelerate_folders(folder: Path) -> tuple[dict[str, Path], dict]:
    """Accelerate's own save_state (safetensors and .bin) and save_model sharded with an index."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = fresh_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    folders = {"safetensors": folder / "state", "bin": folder / "state_bin", "sharded": folder / "sharded"}
    accelerator.save_state(str(folders["safetensors"]))
    accelerator.save_state(str(folders["bin"]), safe_serialization=False)
    accelerator.save_model(model, str(folders["sharded"]), max_shard_size="10MB")
    return folders, accelerator.unwrap_model(model).state_dict()
