"""Side-by-side epochs inside one DDP job; launched by bench/trainer_overhead.py and bench/checkpoint_stall.py.

    torchrun --standalone --nproc-per-node 2 bench/ddp_epochs.py loop --rounds 5 --out loop.json
    torchrun --standalone --nproc-per-node 2 bench/ddp_epochs.py checkpoint --every 11 --rounds 5 --out ckpt.json

Every side shares one process group, model, data loader and optimizer (bench/bare_ddp.py: resnet18 at 32 px on
the digits, batch 32 per process, SGD with weight decay 1e-4), and the sides alternate within each round, so
drift of the machine hits them alike. A side's time runs from a barrier to a barrier, over --epochs epochs.
- loop: the trainer's own `train_one_epoch` (train/main.py) against the bare loop; steps per second.
- checkpoint: the bare loop with no save, with the trainer's Checkpointer saving the model and optimizer every
  --every steps synchronously, and asynchronously (--async-save), and with two reference savers
  (bench/save_floors.py): a control that saves nothing, and the raw bytes written asynchronously; time per
  epoch, and on rank 0 how long the loop waited on the saves.
Rank 0 writes the per-round times to --out as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bare_ddp import BareSetup, bare_epoch, bare_setup  # noqa: E402
from bench.save_floors import ControlSaver, RawBytesSaver  # noqa: E402
from train import distributed  # noqa: E402
from train.checkpoint import CheckpointConfig, Checkpointer  # noqa: E402
from train.lifecycle import StopRequest  # noqa: E402
from train.main import train_one_epoch  # noqa: E402


def timed_epochs(s: BareSetup, epochs: int, first_epoch: int, run_epoch: Callable[[], int]) -> tuple[float, int]:
    """(seconds, steps) for `epochs` epochs, barrier to barrier: the slowest rank's time, as DDP feels it."""
    dist.barrier()
    started, steps = time.perf_counter(), 0
    for epoch in range(first_epoch, first_epoch + epochs):
        s.sampler.set_epoch(epoch)
        steps += run_epoch()
    dist.barrier()
    return time.perf_counter() - started, steps


def loop_sides(s: BareSetup) -> dict[str, Callable[[], int]]:
    info = distributed.DistInfo(dist.get_rank(), dist.get_world_size(), s.device, dist.get_backend())
    scaler = torch.amp.GradScaler(s.device.type, enabled=False)  # as the trainer without --amp
    stop = StopRequest()

    def ours() -> int:
        return train_one_epoch(s.model, s.criterion, s.optimizer, scaler, s.loader, info, None, stop, "bench").steps

    return {"bare": lambda: bare_epoch(s), "ours": ours}


Saver = Checkpointer | ControlSaver | RawBytesSaver


def checkpoint_sides(
    s: BareSetup, every: int, folder: Path, blocked: dict[str, dict[str, float]]
) -> tuple[dict[str, Callable[[], int]], list[Saver]]:
    """The sides: no save, then every saver; `blocked[side]` collects the saves made, the seconds the loop waited
    on them (`save()` plus the wait for the last write at the epoch's end), and the CPU seconds the loop's own
    thread spent in them: for sync the whole write, for async the snapshot copy alone."""
    is_main = dist.get_rank() == 0
    savers: dict[str, Saver] = {
        "control": ControlSaver(),
        "raw_bytes": RawBytesSaver(folder / "raw_bytes", is_main),
        "sync": Checkpointer(CheckpointConfig(folder / "sync", keep_last=2), is_main),
        "async": Checkpointer(CheckpointConfig(folder / "async", keep_last=2), is_main, async_save=True),
    }
    saved = {"count": 0}

    def saving_every_k(side: str) -> Callable[[], int]:
        saver = savers[side]

        def waited(call: Callable[[], None]) -> None:
            started, cpu_started = time.perf_counter(), time.thread_time()
            call()
            totals = blocked.setdefault(side, {"saves": 0, "blocked_s": 0.0, "cpu_s": 0.0})
            totals["blocked_s"] += time.perf_counter() - started
            totals["cpu_s"] += time.thread_time() - cpu_started

        def on_step(step: int) -> None:
            if step % every == 0:
                saved["count"] += 1
                state = {
                    "format": "bench",
                    "model": s.model.module.state_dict(),
                    "optimizer": s.optimizer.state_dict(),
                    "epoch": saved["count"],
                    "step": saved["count"],
                }
                waited(lambda: saver.save(state, epoch_done=True, is_best=False))
                blocked[side]["saves"] += 1

        def run() -> int:
            steps = bare_epoch(s, on_step)
            waited(saver.wait)  # an async write still in flight finishes inside the timed window: nothing is left owed
            return steps

        return run

    sides = {"no_save": lambda: bare_epoch(s), **{side: saving_every_k(side) for side in savers}}
    return sides, list(savers.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("compare", choices=("loop", "checkpoint"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=2, help="epochs per side and round")
    p.add_argument("--every", type=int, default=11, help="checkpoint: steps between saves")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    s = bare_setup(args.batch_size)
    with tempfile.TemporaryDirectory(prefix="ddp-epochs-", dir=args.out.parent) as folder:
        savers: list[Saver] = []
        blocked: dict[str, dict[str, float]] = {}  # checkpoint: per side, what the loop waited on its saves
        if args.compare == "loop":
            sides = loop_sides(s)
        else:
            sides, savers = checkpoint_sides(s, args.every, Path(folder), blocked)
        timed_epochs(s, 1, 0, sides["bare" if args.compare == "loop" else "no_save"])  # warm-up, not counted
        rounds: list[dict[str, dict[str, float]]] = []
        epoch = 1
        for round_ in range(args.rounds):
            names = list(sides)
            names = names[round_ % len(names) :] + names[: round_ % len(names)]  # rotate who goes first
            figures = {}
            for name in names:
                seconds, steps = timed_epochs(s, args.epochs, epoch, sides[name])
                epoch += args.epochs
                figures[name] = {"seconds": seconds, "steps": steps, "epochs": args.epochs, **blocked.pop(name, {})}
            rounds.append(figures)
        for saver in savers:
            saver.close()
    if dist.get_rank() == 0:
        state_mb = sum(t.numel() * t.element_size() for t in s.model.module.state_dict().values()) / 1e6
        args.out.write_text(json.dumps({"rounds": rounds, "model_mb": state_mb, "every": args.every}, indent=2))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
