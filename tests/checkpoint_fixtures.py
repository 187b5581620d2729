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
    save("imagenet_example.pth.tar", {  # what the ImageNet example's save_checkpoint writes
        "epoch": 90, "arch": ARCH, "state_dict": nn.DataParallel(fresh_model()).state_dict(),
        "best_acc1": torch.tensor(71.2), "optimizer": optimizer.state_dict(),
        "scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 30).state_dict(),
    })
    lightning = {f"model.{k}": v for k, v in bare.items()}
    lightning["criterion.weight"] = torch.ones(CLASSES)  # a LightningModule's own, non-model state
    save("lightning.ckpt", {"epoch": 4, "global_step": 400, "pytorch-lightning_version": "2.4.0",
                            "state_dict": lightning, "hyper_parameters": {"arch": ARCH, "num_classes": CLASSES},
                            "optimizer_states": [], "lr_schedulers": []})
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
