"""A plain DDP training script, the way the question's readers write one (nothing from handoff):

    torchrun --nproc-per-node 2 train_ddp.py text OUT.pth
    torchrun --nproc-per-node 2 train_ddp.py tabular OUT.pth

gloo on the CPU, a few steps on synthetic data, and `torch.save(model.state_dict(), ...)` on rank 0: the
DDP-wrapped model's state, so every key starts with `module.`.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from models import CATEGORIES, CLASSES, FEATURES, LEVELS, VOCAB, TabularModel, TextClassifier
from torch.nn.parallel import DistributedDataParallel as DDP


def text_batch(generator: torch.Generator) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    tokens = torch.randint(1, VOCAB, (16, 12), generator=generator)
    lengths = torch.randint(4, 13, (16,), generator=generator)
    mask = torch.arange(12)[None, :] >= lengths[:, None]  # True where padded
    tokens[mask] = 0
    labels = tokens[:, 0] % CLASSES
    return (tokens, mask), labels


def tabular_batch(generator: torch.Generator) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    features = torch.randn(16, FEATURES, generator=generator)
    categories = torch.randint(0, LEVELS, (16, CATEGORIES), generator=generator)
    labels = (features[:, 0] > 0).long() + (categories[:, 0] > 2).long()
    return (features, categories), labels


def main() -> None:
    task, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(TextClassifier() if task == "text" else TabularModel())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(20):
        inputs, labels = (text_batch if task == "text" else tabular_batch)(generator)
        output = model(*inputs)
        logits = output if task == "text" else torch.log(output["probs"] + 1e-6)
        loss = nn.functional.cross_entropy(logits, labels)
        if task == "tabular":
            loss = loss + output["score"].square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if rank == 0:
        torch.save(model.state_dict(), out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
