"""Shared helpers: launch the real trainer under torchrun, read real checkpoint files."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TRAIN = str(ROOT / "train" / "main.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


class Server:
    """`bentoml serve` from the repo root, as a real process on a free localhost port."""

    def __init__(self, log: Path, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [str(Path(sys.executable).parent / "bentoml"), "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env}, stdout=open(log, "w"),
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def status(self, path: str) -> int | None:
        import httpx

        try:
            return httpx.get(self.url + path, timeout=5).status_code
        except httpx.HTTPError:
            return None

    def wait_ready(self, timeout: float = 180) -> float:
        started = time.monotonic()
        wait_for(lambda: self.status("/readyz") == 200 or self.proc.poll() is not None, timeout,
                 interval=0.2, what=f"{self.url}/readyz")
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        return time.monotonic() - started

    def wait_live(self, timeout: float = 180) -> None:
        wait_for(lambda: self.status("/livez") == 200, timeout, interval=0.2, what=f"{self.url}/livez")

    def stop(self) -> None:
        import signal

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
