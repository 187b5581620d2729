"""Launch 2-process torchrun jobs for the trainer benchmarks (bench/trainer_overhead.py, bench/checkpoint_stall.py);
on CUDA, one process per GPU, at most 2 (NCCL wants a GPU of its own for each process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
NPROC = 2


def torchrun(device: str) -> tuple[list[str], dict[str, str]]:
    """The torchrun command line and environment: gloo with the GPUs hidden on `cpu`, NCCL on `cuda`."""
    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {})}
    nproc = NPROC if device == "cpu" else max(1, min(NPROC, torch.cuda.device_count()))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    return cmd, env


def run_ddp_epochs(device: str, compare: str, folder: Path, *flags: str) -> dict[str, Any]:
    """Run bench/ddp_epochs.py `compare` with `flags` and return what rank 0 wrote (per-round times)."""
    launch, env = torchrun(device)
    out = folder / f"{compare}.json"
    command = [*launch, "bench/ddp_epochs.py", compare, *flags, "--out", str(out)]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, env=env)
    return json.loads(out.read_text())
