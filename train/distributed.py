"""Process-group setup and the few collectives the trainer needs.

Everything distributed reads the environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK) in one
place, so `python train/main.py` (no torchrun) simply runs as a world of one.
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    device: torch.device  # this process's GPU (chosen by LOCAL_RANK), or the CPU
    backend: str | None  # None when running without a process group

    @property
    def is_main(self) -> bool:
        """Global rank 0: the only process that writes anything to the run folder."""
        return self.rank == 0


def setup(timeout_s: float = 1800.0) -> DistInfo:
    """Join the process group torchrun prepared, or run alone when there is none.

    NCCL with one GPU per process (LOCAL_RANK) where CUDA is present, gloo on the CPU.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if "RANK" not in os.environ:
        return DistInfo(0, 1, device, None)
    timeout = datetime.timedelta(seconds=timeout_s)
    init_kwargs: dict[str, Any] = {"backend": backend, "timeout": timeout}
    if "TORCHELASTIC_RESTART_COUNT" in os.environ:
        init_kwargs.update(store=_store_for_this_attempt(rank, world_size, timeout), rank=rank, world_size=world_size)
    if backend == "nccl":
        init_kwargs["device_id"] = device
    dist.init_process_group(**init_kwargs)
    return DistInfo(rank, world_size, device, backend)


def _store_for_this_attempt(rank: int, world_size: int, timeout: datetime.timedelta) -> dist.Store:
    """torchrun's rendezvous store, with a key prefix unique to this restart attempt.

    torchrun (2.14) hands restarted workers the same agent store without a per-attempt prefix, so a
    restarted gloo rank reads the dead ranks' addresses and hangs in init_process_group. The prefix
    gives every attempt a clean key space.
    """
    agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=not agent_hosts_store and rank == 0,
        timeout=timeout,
    )
    return dist.PrefixStore(f"handoff/attempt_{os.environ['TORCHELASTIC_RESTART_COUNT']}", store)


def leave_together() -> None:
    """After a run every rank finished: wait for the others, then leave the process group.

    A rank that tears gloo down (or just exits) while rank 0 still writes the last checkpoint can abort in gloo's
    threads ("terminate called without an active exception"), so no rank leaves before all have arrived. Only after
    success: a rank that failed alone would never arrive, and `cleanup` is what runs then.
    """
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def cleanup() -> None:
    """Leave the process group without waiting for the other ranks (after an error)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum a few scalars over all ranks (float64, so counts stay exact)."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank when it is true on at least one: how ranks agree to stop together."""
    return all_reduce_sum([1.0 if flag else 0.0], device)[0] > 0


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank."""
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any) -> Any:
    """Rank 0's `obj` on every rank."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
