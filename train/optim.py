"""Optimizer and learning-rate schedule: SGD with momentum, cosine or step decay per epoch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

SCHEDULES = ("cosine", "step", "constant")


@dataclass
class OptimConfig:
    """How the weights move."""

    epochs: int = 10  # total epochs; the schedule spans exactly this many
    lr: float = 0.1  # initial learning rate
    momentum: float = 0.9
    weight_decay: float = 1e-4  # not applied to norm layers and biases
    schedule: str = "cosine"  # cosine | step | constant
    step_size: int = 30  # step schedule: epochs between decays
    gamma: float = 0.1  # step schedule: decay factor

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"--epochs={self.epochs}: train at least one epoch")
        if self.lr <= 0:
            raise ValueError(f"--lr={self.lr}: must be positive")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"--schedule={self.schedule!r}: choose one of {', '.join(SCHEDULES)}")


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for param in model.parameters():
        if param.requires_grad:
            (no_decay if param.ndim <= 1 else decay).append(param)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig) -> torch.optim.lr_scheduler.LRScheduler:
    if cfg.schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=cfg.epochs)
    if cfg.schedule == "step":
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=cfg.step_size, gamma=cfg.gamma)
    return torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
