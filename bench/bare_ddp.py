"""The bare DDP loop the trainer is measured against: same model, data, transforms, batch and processes,
and nothing else (no evaluation, logging, metrics or checkpoints). Launched by bench/trainer_overhead.py.

    torchrun --standalone --nproc-per-node 2 bench/bare_ddp.py --epochs 5 --batch-size 32
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from train.data import DigitsDataset, digits_split
from train.models import build_model
from train.preprocessing import Preprocessing
from train.presets import train_transform


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()
    cuda = torch.cuda.is_available()  # like the trainer: NCCL and one GPU per process where CUDA is visible
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(0)
    (x_train, y_train), _ = digits_split()
    dataset = DigitsDataset(x_train, y_train, train_transform(Preprocessing(crop=32, resize=32), 0.5, 0.0))
    sampler = DistributedSampler(dataset, seed=0, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    model = DistributedDataParallel(
        build_model("resnet18", 10, 32).to(device), device_ids=[device.index] if cuda else None
    )
    lr = 0.1 * args.batch_size * dist.get_world_size() / 256
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for images, targets in loader:
            images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            loss = criterion(model(images), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    if int(os.environ["RANK"]) == 0:
        print(f"steps per epoch {len(loader)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
