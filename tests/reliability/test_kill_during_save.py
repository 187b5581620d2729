"""SIGKILL rank 0 at random moments of its checkpoint writes, many times: last.pt must always load
(weights_only=True) and the run must always resume. Prints the count."""

from __future__ import annotations

import random
import signal
import sys
import time
from pathlib import Path

from conftest import TRAIN, load, run, start, wait_for

KILLS = 20


def test_sigkill_at_random_moments_of_checkpoint_writes(tmp_path: Path):
    out = tmp_path / "run"
    rng = random.Random(0)

    def train_cmd(epochs: int) -> list[str]:
        # 16 px and large batches: the epochs between writes cost little, the writes (the whole model) as much
        # as ever.
        args = ["--epochs", str(epochs), "--workers", "0", "--image-size", "16", "--batch-size", "128"]
        args += ["--keep-last", "1"]
        return [sys.executable, TRAIN, *args, "--out", str(out)]

    failures, mid_write, epochs = [], 0, []
    for attempt in range(KILLS):
        before = load(out / "last.pt")["epoch"] if (out / "last.pt").exists() else 0
        proc = start(train_cmd(1000), tmp_path / f"train{attempt}.log")
        # The write of the next epoch file by this process (the first run is let through one complete save).
        pattern = f".epoch_{max(before, 1) + 1:04d}.pt.tmp.*"  # the temporary's name is unpredictable

        def writing(pattern: str = pattern) -> bool:
            return any(out.glob(pattern))

        wait_for(writing, timeout=300, interval=0.001, what=pattern)
        time.sleep(rng.uniform(0, 0.08))  # somewhere inside the ~100-200 ms write, or just after it
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        mid_write += writing()
        try:
            survivor = load(out / "last.pt")  # complete, whatever the moment of the kill
            assert survivor["epoch"] >= before, f"went back from epoch {before} to {survivor['epoch']}"
            epochs.append(survivor["epoch"])
        except Exception as err:  # noqa: BLE001 - counted, reported below
            failures.append(f"kill {attempt}: {type(err).__name__}: {err}")
    print(
        f"\nSIGKILL during checkpoint writes: {KILLS} kills, {mid_write} left a partial temporary, "
        f"{len(failures)} failures; epochs reached {epochs[:3]}...{epochs[-3:]}"
    )
    assert not failures, failures
    assert mid_write >= KILLS // 2, "most kills should land inside a write"
    assert epochs == sorted(epochs), "a kill never takes the run back to an older checkpoint"
    # And the run still finishes: resume once more, to one epoch past the last committed one.
    final = run(train_cmd(epochs[-1] + 1))
    assert final.returncode == 0, final.stderr[-2000:]
    assert "resuming from" in final.stderr and load(out / "last.pt")["epoch"] == epochs[-1] + 1
    assert not list(out.glob(".*.tmp.*")), "stale temporaries are cleaned up"
