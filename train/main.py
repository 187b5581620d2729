"""Train a torchvision classifier with DistributedDataParallel; save once per job, on global rank 0.

One machine, N processes (gloo on the CPU, NCCL with one GPU per process where CUDA is present):
    torchrun --standalone --nproc-per-node 2 train/main.py --out runs/digits
One process, no torchrun:
    python train/main.py --out runs/digits --epochs 2
Several nodes, the same script (run on every node):
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 --rdzv-id job1 \\
        train/main.py --data /data/imagenet --arch resnet50 --image-size 224 --batch-size 64 --out runs/in1k

Resume is automatic (`--resume auto`): a restarted job continues from RUN/last.pt, mid-epoch included.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from tqdm import tqdm

from train import distributed
from train.checkpoint import (
    EMBEDDED_DIGITS,
    CheckpointConfig,
    Checkpointer,
    CheckpointError,
    CheckpointWriteError,
    Progress,
    Trainables,
    capture_rng,
    make_meta,
    restore_training_state,
    training_state,
)
from train.data import DataConfig, build_datasets, build_loaders
from train.lifecycle import EXIT_PREEMPTED, StopRequest, exit_when_orphaned
from train.metrics import EpochMetrics, MetricsLog
from train.models import build_model, check_arch
from train.optim import SCHEDULES, OptimConfig, build_optimizer, build_scheduler

log = logging.getLogger("train")

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="DDP training of a torchvision classifier. Global rank 0 alone writes the run folder "
        "(last.pt, best.pt, epoch_*.pt, metrics.csv, curves.png).",
        epilog="launch: " + __doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("data")
    g.add_argument(
        "--data",
        default=None,
        help="ImageFolder root holding train/ and val/ (default: the embedded "
        "scikit-learn handwritten digits, 1,797 images, 10 classes)",
    )
    g.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="side of the square the model sees (default: 32; "
        "for timm/NAME the model's own input size from timm's data config)",
    )
    g.add_argument(
        "--resize",
        type=int,
        default=None,
        help="eval resize before the center crop (default: the image "
        "size for the digits; for an ImageFolder image size / 0.875, or timm's crop_pct for timm/NAME)",
    )
    g.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per rank (default: 2)")
    g = p.add_argument_group("model and optimisation")
    g.add_argument(
        "--arch",
        default="resnet18",
        help="a torchvision classifier (resnet50), or timm/NAME for a timm model "
        "(timm/convnext_atto); a bare name is always torchvision's, also where timm has one too. timm "
        "models take timm's mean, std and interpolation (default: resnet18)",
    )
    g.add_argument("--epochs", type=int, default=10, help="total epochs; the schedule spans them (default: 10)")
    g.add_argument("--batch-size", type=int, default=32, help="images per process per step (default: 32)")
    g.add_argument(
        "--lr",
        type=float,
        default=None,
        help="initial learning rate (default: 0.1 x global batch / 256, the linear scaling rule)",
    )
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default: 0.9)")
    g.add_argument("--weight-decay", type=float, default=1e-4, help="not applied to norms and biases (default: 1e-4)")
    g.add_argument("--schedule", choices=SCHEDULES, default="cosine", help="learning-rate schedule (default: cosine)")
    g.add_argument("--step-size", type=int, default=30, help="step schedule: epochs between decays (default: 30)")
    g.add_argument("--gamma", type=float, default=0.1, help="step schedule: decay factor (default: 0.1)")
    g.add_argument(
        "--amp",
        choices=sorted(AMP_DTYPES),
        default=None,
        help="mixed precision; fp16 adds a grad scaler and is slow on the CPU, use bf16 there (default: off)",
    )
    g.add_argument("--seed", type=int, default=0, help="same seed, same run, bit for bit on the CPU (default: 0)")
    g = p.add_argument_group("checkpoints")
    g.add_argument(
        "--out", default="runs/default", help="run folder, written by global rank 0 only (default: runs/default)"
    )
    g.add_argument(
        "--resume",
        default="auto",
        help="auto: continue from OUT/last.pt when present; none: start afresh; or a checkpoint path (default: auto)",
    )
    g.add_argument(
        "--keep-last", type=int, default=3, help="epoch checkpoints kept besides last.pt and best.pt (default: 3)"
    )
    g.add_argument(
        "--async-save",
        action="store_true",
        help="write checkpoints in the background: the loop waits "
        "only for a copy of the state in CPU memory (at most one save in flight)",
    )
    return p


def setup_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [rank{rank}] %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )


STOP_CHECK_EVERY = 8  # steps between the collective that asks every rank whether one was told to stop


@dataclass
class EpochTotals:
    """One rank's sums over the steps it trained this epoch."""

    loss_sum: float
    correct: int
    count: int
    steps: int
    stopped: bool  # a stop request (SIGTERM) ended the epoch early


def train_one_epoch(
    model: nn.Module,
    criterion: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    loader: DataLoader,
    info: distributed.DistInfo,
    amp_dtype: torch.dtype | None,
    stop: StopRequest,
    desc: str,
) -> EpochTotals:
    """Train one epoch. Loss and accuracy are summed on the device and read once at the end (a `.item()` per
    step would stall a GPU's queue every step); a stop request is checked every STOP_CHECK_EVERY steps (a
    collective per step would cost as much), so a SIGTERM is honoured within that many steps."""
    model.train()
    loss_sum = torch.zeros((), device=info.device)
    correct = torch.zeros((), dtype=torch.long, device=info.device)
    count, steps = 0, 0
    # disable=None: tqdm draws only on a terminal, so logs and CI output stay readable.
    bar = tqdm(loader, desc=desc, disable=None if info.is_main else True, leave=False, dynamic_ncols=True)
    for images, targets in bar:
        if steps % STOP_CHECK_EVERY == 0 and distributed.any_rank(stop.requested, info.device):
            return EpochTotals(float(loss_sum), int(correct), count, steps, True)
        images, targets = images.to(info.device, non_blocking=True), targets.to(info.device, non_blocking=True)
        with torch.autocast(info.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            output = model(images)
            loss = criterion(output, targets)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        steps += 1
        loss_sum += loss.detach().float() * len(targets)
        correct += (output.argmax(1) == targets).sum()
        count += len(targets)
        if not bar.disable and steps % STOP_CHECK_EVERY == 0:  # the bar's loss: a sync only when it is drawn
            bar.set_postfix(loss=f"{loss.item():.3f}")
    return EpochTotals(float(loss_sum), int(correct), count, steps, distributed.any_rank(stop.requested, info.device))


@torch.inference_mode()
def evaluate(
    model: nn.Module, criterion: nn.Module, loader: DataLoader, info: distributed.DistInfo
) -> tuple[float, float]:
    """Loss and top-1 accuracy (%) over the whole validation set, summed across ranks."""
    model.eval()
    loss_sum = torch.zeros((), device=info.device)  # summed on the device, read once
    correct = torch.zeros((), dtype=torch.long, device=info.device)
    count = 0
    for images, targets in loader:
        images, targets = images.to(info.device), targets.to(info.device)
        output = model(images)
        loss_sum += criterion(output, targets).float() * len(targets)
        correct += (output.argmax(1) == targets).sum()
        count += len(targets)
    total_loss, total_correct, total = distributed.all_reduce_sum([float(loss_sum), int(correct), count], info.device)
    return total_loss / total, 100.0 * total_correct / total


def main(args: argparse.Namespace) -> int:
    exit_when_orphaned()
    info = distributed.setup()
    setup_logging(info.rank)
    try:
        exit_code = train(args, info)
        distributed.leave_together()
        return exit_code
    except CheckpointWriteError as err:  # the environment failed (full disk...), not the command line
        log.error("%s", err)
        return 1
    except (ValueError, CheckpointError) as err:
        log.error("%s", err)
        return 2
    finally:
        distributed.cleanup()


def train(args: argparse.Namespace, info: distributed.DistInfo) -> int:
    check_arch(args.arch)
    stop = StopRequest()
    data_cfg = DataConfig(
        data=args.data,
        arch=args.arch,
        image_size=args.image_size,
        resize=args.resize,
        batch_size=args.batch_size,
        workers=args.workers,
    )
    lr = args.lr if args.lr is not None else 0.1 * args.batch_size * info.world_size / 256
    optim_cfg = OptimConfig(
        epochs=args.epochs,
        lr=lr,
        momentum=args.momentum,
        weight_decay=args.weight_decay,
        schedule=args.schedule,
        step_size=args.step_size,
        gamma=args.gamma,
    )
    ckpt_cfg = CheckpointConfig(folder=args.out, keep_last=args.keep_last)
    log.info("world size %d, backend %s, device %s", info.world_size, info.backend or "none", info.device)

    torch.manual_seed(args.seed)  # identical initial weights on every rank
    ds = build_datasets(data_cfg, args.seed)
    train_loader, sampler, val_loader = build_loaders(
        ds, data_cfg, info.rank, info.world_size, args.seed, info.device.type == "cuda"
    )
    model = build_model(args.arch, len(ds.classes), ds.preprocessing.crop).to(info.device)
    optimizer = build_optimizer(model, optim_cfg)
    scheduler = build_scheduler(optimizer, optim_cfg)
    amp_dtype = AMP_DTYPES.get(args.amp) if args.amp else None
    if args.amp == "fp16" and info.device.type == "cpu":
        log.warning("--amp fp16 on the CPU is emulated and about 50x slower here; use --amp bf16")
    scaler = torch.amp.GradScaler(info.device.type, enabled=args.amp == "fp16")
    criterion = nn.CrossEntropyLoss()
    try:  # rank 0 takes the run folder's lock here; its refusal reaches every rank, as the same kind of error
        checkpointer, error = Checkpointer(ckpt_cfg, info.is_main, async_save=args.async_save), None
    except CheckpointError as err:
        checkpointer, error = None, (isinstance(err, CheckpointWriteError), str(err))
    error = distributed.broadcast_object(error)
    if error:
        unwritable, message = error  # an unwritable folder exits 1 here as at save time; a refusal exits 2
        raise (CheckpointWriteError if unwritable else CheckpointError)(message)
    assert checkpointer is not None
    metrics = MetricsLog(ckpt_cfg.folder)
    meta = make_meta(
        args.arch,
        ds.classes,
        ds.preprocessing,
        info.world_size,
        data=str(Path(args.data).resolve()) if args.data else EMBEDDED_DIGITS,
    )

    torch.manual_seed(args.seed + info.rank)  # from here on, each rank draws its own random numbers
    epoch, position, step, best_acc1 = 0, 0, 0, 0.0
    # Rank 0 alone reads the checkpoint and broadcasts it: other nodes need not share its file system.
    ckpt = checkpointer.load(args.resume)  # the same checkpoint (or error) on every rank
    live = Trainables(model, optimizer, scheduler, scaler)  # the bare module: DDP wraps it below
    if ckpt is not None:
        progress = restore_training_state(ckpt, live, info.rank, info.world_size)
        step, best_acc1 = progress.step, progress.best_acc1
        epoch, position = progress.sampler_epoch, progress.sampler_position
        saved_world = len(ckpt["rng"])
        if saved_world != info.world_size:
            log.warning(
                "checkpoint written by %d processes, resuming with %d: per-rank RNG state not restored "
                "(ranks reseeded from --seed); data order and augmentation still continue exactly, "
                "the global batch is now %d",
                saved_world,
                info.world_size,
                args.batch_size * info.world_size,
            )
            torch.manual_seed(args.seed + info.rank + 1_000 * epoch)
        if info.is_main:
            metrics.truncate_after(ckpt["epoch"])
        del ckpt

    model_without_ddp = model
    if info.backend is not None:
        model = DistributedDataParallel(model, device_ids=[info.device.index] if info.device.type == "cuda" else None)

    def state(epoch_done: int, sampler_epoch: int, sampler_position: int) -> dict[str, Any]:
        progress = Progress(epoch_done, step, best_acc1, sampler_epoch, sampler_position)
        return training_state(live, progress, distributed.gather_objects(capture_rng()), meta)

    try:
        global_batch = args.batch_size * info.world_size
        val_acc1 = None
        while epoch < args.epochs:
            started = time.monotonic()
            sampler.set_epoch(epoch, start=position)
            ds.train.set_epoch(epoch)
            totals = train_one_epoch(
                model,
                criterion,
                optimizer,
                scaler,
                train_loader,
                info,
                amp_dtype,
                stop,
                f"epoch {epoch + 1}/{args.epochs}",
            )
            step += totals.steps
            position += totals.steps * global_batch
            if totals.stopped:
                checkpointer.save(state(epoch, epoch, position), epoch_done=False, is_best=False)
                checkpointer.wait()
                log.warning(
                    "preempted: saved %s at epoch %d, step %d; rerun the same command to resume",
                    checkpointer.last,
                    epoch + 1,
                    step,
                )
                return EXIT_PREEMPTED
            lr = optimizer.param_groups[0]["lr"]
            scheduler.step()
            train_loss, train_correct, train_count = distributed.all_reduce_sum(
                [totals.loss_sum, totals.correct, totals.count], info.device
            )
            val_loss, val_acc1 = evaluate(model_without_ddp, criterion, val_loader, info)
            is_best = val_acc1 > best_acc1
            best_acc1 = max(best_acc1, val_acc1)
            epoch, position = epoch + 1, 0
            checkpointer.save(state(epoch, epoch, 0), epoch_done=True, is_best=is_best)
            row = EpochMetrics(
                epoch,
                step,
                lr,
                train_loss / max(train_count, 1),
                100.0 * train_correct / max(train_count, 1),
                val_loss,
                val_acc1,
                time.monotonic() - started,
            )
            if info.is_main:
                metrics.append(row)
            log.info(
                "epoch %d/%d  train loss %.4f acc1 %.2f%%  val loss %.4f acc1 %.2f%%  lr %.4g  %.1fs",
                epoch,
                args.epochs,
                row.train_loss,
                row.train_acc1,
                val_loss,
                val_acc1,
                lr,
                row.seconds,
            )

        if val_acc1 is None:  # resumed a finished run: report what it has
            _, val_acc1 = evaluate(model_without_ddp, criterion, val_loader, info)
        if info.is_main:
            print(
                f"val acc1 {val_acc1:.2f}% (best {best_acc1:.2f}%) after {epoch} epochs; "
                f"checkpoint: {checkpointer.last}"
            )
        return 0
    finally:
        checkpointer.close()  # an asynchronous save in flight is always finished, or its error raised


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
