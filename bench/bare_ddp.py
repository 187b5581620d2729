"""The bare DDP training a user writes by hand, which the trainer is measured against: same model (resnet18 at
32 px), data (the embedded digits, the trainer's augmentation), batch (32 per process), SGD with momentum 0.9 and
weight decay 1e-4, and processes. Launched by bench/trainer_overhead.py; its pieces are imported by
bench/ddp_epochs.py.

    torchrun --standalone --nproc-per-node 2 bench/bare_ddp.py --epochs 5 [--evaluate-and-save DIR]

--evaluate-and-save: after each epoch, also what the trainer does between epochs in its plainest form: top-1 on
the validation set (summed across processes) and `torch.save` of the model and optimizer on rank 0.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from contract.preprocessing import Preprocessing  # noqa: E402
from train.data import DigitsDataset, digits_split  # noqa: E402
from train.models import build_model  # noqa: E402
from train.presets import eval_transform, train_transform  # noqa: E402


@dataclass
class BareSetup:
    device: torch.device
    model: DistributedDataParallel
    optimizer: torch.optim.Optimizer
    criterion: nn.Module
    sampler: DistributedSampler
    loader: DataLoader
    val_loader: DataLoader


def bare_setup(batch_size: int) -> BareSetup:
    """Join the process group torchrun prepared and build everything, the way the trainer's defaults do."""
    cuda = torch.cuda.is_available()  # like the trainer: NCCL and one GPU per process where CUDA is visible
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(0)
    (x_train, y_train), (x_val, y_val) = digits_split()
    size = Preprocessing(crop=32, resize=32)
    dataset = DigitsDataset(x_train, y_train, train_transform(size, 0.5, 0.0))
    sampler: DistributedSampler = DistributedSampler(dataset, seed=0, drop_last=True)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True)
    val_set = DigitsDataset(x_val, y_val, eval_transform(size))
    val_loader = DataLoader(val_set, batch_size=batch_size, sampler=DistributedSampler(val_set, shuffle=False))
    model = DistributedDataParallel(
        build_model("resnet18", 10, 32).to(device), device_ids=[device.index] if cuda else None
    )
    lr = 0.1 * batch_size * dist.get_world_size() / 256
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    return BareSetup(device, model, optimizer, nn.CrossEntropyLoss(), sampler, loader, val_loader)


def bare_epoch(s: BareSetup, on_step=None) -> int:  # noqa: ANN001 - an optional callback(step)
    """One epoch of forward, loss, backward, step, and nothing else; returns the number of steps."""
    s.model.train()
    steps = 0
    for images, targets in s.loader:
        images, targets = images.to(s.device, non_blocking=True), targets.to(s.device, non_blocking=True)
        loss = s.criterion(s.model(images), targets)
        s.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        s.optimizer.step()
        steps += 1
        if on_step is not None:
            on_step(steps)
    return steps


@torch.inference_mode()
def bare_evaluate(s: BareSetup) -> float:
    s.model.eval()
    correct = torch.zeros(2, device=s.device)
    for images, targets in s.val_loader:
        output = s.model.module(images.to(s.device))
        correct += torch.stack([(output.argmax(1) == targets.to(s.device)).sum(), torch.tensor(len(targets))])
    dist.all_reduce(correct)
    return float(100 * correct[0] / correct[1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--evaluate-and-save", type=Path, default=None, metavar="DIR")
    args = p.parse_args()
    s = bare_setup(args.batch_size)
    for epoch in range(args.epochs):
        s.sampler.set_epoch(epoch)
        bare_epoch(s)
        if args.evaluate_and_save is not None:
            acc1 = bare_evaluate(s)
            if dist.get_rank() == 0:
                state = {"model": s.model.module.state_dict(), "optimizer": s.optimizer.state_dict(), "epoch": epoch}
                torch.save(state, args.evaluate_and_save / "checkpoint.pt")
                print(f"epoch {epoch + 1}: val acc1 {acc1:.2f}%")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
