"""Shared helpers: launch the real trainer under torchrun, read real checkpoint files."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from serve.process import BentoServer, free_port  # noqa: F401 - re-exported for the tests

ROOT = Path(__file__).resolve().parents[1]
TRAIN = str(ROOT / "train" / "main.py")



def torchrun_cmd(nproc: int, *train_args: str, launcher_args: tuple[str, ...] = ()) -> list[str]:
    if not launcher_args:
        launcher_args = ("--standalone",)
    return [sys.executable, "-m", "torch.distributed.run", *launcher_args, "--nproc-per-node", str(nproc),
            TRAIN, *train_args]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def run(cmd: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout)


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait_for(predicate, timeout: float, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"


@pytest.fixture(scope="session")
def digits_args() -> tuple[str, ...]:
    """Fast, deterministic settings for the embedded digits (CPU)."""
    return ("--epochs", "4", "--batch-size", "32", "--seed", "1")


Server = BentoServer  # the tests start the service exactly as `make demo` does
