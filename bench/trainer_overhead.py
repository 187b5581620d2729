"""What the trainer costs over the DDP training a user writes by hand, in two figures.

    python bench/trainer_overhead.py [--epochs 5] [--rounds 3] [--device cpu|cuda]

Both with 2 processes (gloo on the CPU, NCCL with one GPU each), resnet18 at 32 px on the embedded digits,
batch 32 per process, SGD with weight decay 1e-4, DataLoader in the main process (bench/bare_ddp.py).
1. The loop alone: steps per second of the trainer's `train_one_epoch` against a bare loop (forward, loss,
   backward, step), alternating inside one job (bench/ddp_epochs.py loop), median of rounds.
2. The whole trainer (`torchrun train/main.py`: evaluation, checkpoint with resume state, metrics.csv,
   curves.png, logging) against a bare loop that also evaluates and `torch.save`s each epoch
   (`bench/bare_ddp.py --evaluate-and-save`), each timed as a whole torchrun command (start-up included on
   both), alternating, median of rounds.
Goal: both ratios >= 0.95.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.ddp_launch import run_ddp_epochs, torchrun  # noqa: E402
from bench.results import print_goal, write_result  # noqa: E402

GOAL = "loop alone: ours / bare steps/s >= 0.95; whole trainer / bare with evaluation and save >= 0.95"


def timed(cmd: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, env=env)
    return time.perf_counter() - started


def loop_alone(device: str, rounds: int, work: Path) -> dict[str, float]:
    """Median steps/s of each side over rounds (bench/ddp_epochs.py loop)."""
    per_round = run_ddp_epochs(device, "loop", work, "--rounds", str(rounds))["rounds"]
    return {
        side: statistics.median(r[side]["steps"] / r[side]["seconds"] for r in per_round) for side in ("bare", "ours")
    }


def whole_runs(device: str, epochs: int, rounds: int, work: Path) -> dict[str, float]:
    """Median wall seconds of each whole torchrun command over rounds."""
    launch, env = torchrun(device)
    common = ["--epochs", str(epochs), "--batch-size", "32"]
    bare, ours = [], []
    for round_ in range(rounds):
        folder = work / f"round{round_}"
        (folder / "bare").mkdir(parents=True)
        bare.append(timed([*launch, "bench/bare_ddp.py", *common, "--evaluate-and-save", str(folder / "bare")], env))
        ours.append(timed([*launch, "train/main.py", *common, "--workers", "0", "--out", str(folder / "ours")], env))
    return {"bare_with_eval_and_save": statistics.median(bare), "ours": statistics.median(ours)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=5, help="epochs of each whole run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: NCCL, one GPU per process")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="trainer-bench-") as folder:
        work = Path(folder)
        steps_per_s = loop_alone(args.device, max(args.rounds, 3), work)
        wall = whole_runs(args.device, args.epochs, args.rounds, work)
    ratios = {
        "loop_ours_over_bare_steps_per_s": steps_per_s["ours"] / steps_per_s["bare"],
        "trainer_over_bare_with_eval_and_save": wall["bare_with_eval_and_save"] / wall["ours"],  # speed = 1 / time
    }
    print(
        f"loop alone: bare {steps_per_s['bare']:.2f} steps/s, ours {steps_per_s['ours']:.2f} steps/s -> "
        f"{ratios['loop_ours_over_bare_steps_per_s']:.3f}"
    )
    print(
        f"whole run ({args.epochs} epochs): bare with evaluation and save {wall['bare_with_eval_and_save']:.1f} s, "
        f"trainer {wall['ours']:.1f} s -> {ratios['trainer_over_bare_with_eval_and_save']:.3f}"
    )
    goal_met = all(r >= 0.95 for r in ratios.values())
    print_goal(GOAL, goal_met)
    write_result(
        "trainer_overhead",
        {
            "device": args.device,
            "rounds": args.rounds,
            "steps_per_s": steps_per_s,
            "seconds": {f"{name}_run": seconds for name, seconds in wall.items()},
            "ratios": ratios,
            "goal": GOAL,
            "goal_met": goal_met,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
