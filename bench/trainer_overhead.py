"""Trainer overhead: images/s of train/main.py against a bare DDP loop (bench/bare_ddp.py).

    python bench/trainer_overhead.py [--epochs 5] [--rounds 2]

Both with 2 gloo processes, resnet18 at 32 px on the embedded digits, batch 32 per process, DataLoader
in the main process. Ours also evaluates, logs, writes metrics, curves and checkpoints every epoch: that
is the overhead measured. Each side is timed as a whole torchrun command (start-up included on both),
alternating, median of rounds. Goal: ours / bare >= 0.95.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.results import write_result  # noqa: E402
from train.data import digits_split  # noqa: E402


def timed(cmd: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, env=env)
    return time.perf_counter() - started


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: NCCL, one GPU per process")
    args = p.parse_args()
    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if args.device == "cpu" else {})}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    common = ["--epochs", str(args.epochs), "--batch-size", "32"]
    (x_train, _), _ = digits_split()
    images = args.epochs * (len(x_train) // 2 // 32) * 32 * 2  # steps per epoch x global batch
    bare, ours = [], []
    for _ in range(args.rounds):
        bare.append(timed([*torchrun, "bench/bare_ddp.py", *common], env))
        with tempfile.TemporaryDirectory() as out:
            ours.append(timed([*torchrun, "train/main.py", *common, "--workers", "0", "--out", out], env))
    median = {"bare_run": statistics.median(bare), "ours_run": statistics.median(ours)}
    ratio = median["bare_run"] / median["ours_run"]  # = ours images/s over bare images/s
    print(
        f"{images} training images: bare {images / median['bare_run']:.1f} images/s, "
        f"ours {images / median['ours_run']:.1f} images/s -> ours/bare {ratio:.3f} (goal >= 0.95)"
    )
    write_result(
        f"trainer_overhead_{args.device}",
        {
            "median_seconds": median,
            "ratios": {"ours_over_bare_images_per_s": ratio},
            "images": images,
            "goal": "ours / bare images/s >= 0.95",
            "goal_met": ratio >= 0.95,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
