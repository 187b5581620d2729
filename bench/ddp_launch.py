"""Launch 2-process torchrun jobs for the trainer benchmarks (bench/trainer_overhead.py, bench/checkpoint_stall.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NPROC = 2


def torchrun(device: str) -> tuple[list[str], dict[str, str]]:
    """The torchrun command line and environment: gloo with the GPUs hidden on `cpu`, NCCL on `cuda`."""
    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {})}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(NPROC)]
    return cmd, env


def run_ddp_epochs(device: str, compare: str, folder: Path, *flags: str) -> dict[str, Any]:
    """Run bench/ddp_epochs.py `compare` with `flags` and return what rank 0 wrote (per-round times)."""
    launch, env = torchrun(device)
    out = folder / f"{compare}.json"
    command = [*launch, "bench/ddp_epochs.py", compare, *flags, "--out", str(out)]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, env=env)
    return json.loads(out.read_text())
