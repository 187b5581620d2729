"""A full disk or a read-only folder at save time: one clear error, a non-zero exit, and the previous
checkpoint untouched. The faults are real: a small tmpfs filled up, a tmpfs mounted read-only."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TRAIN, load, run, torchrun_cmd

from contract.manifest import sha256_file

pytestmark = pytest.mark.xdist_group("save_faults")  # its module fixtures stay on one worker

# A small model in large batches: few, cheap steps an epoch. Its checkpoint (~3 MB) goes through the same
# writer as resnet18's; the disk below is sized for it.
FAST = ("--arch", "shufflenet_v2_x0_5", "--batch-size", "128", "--seed", "1", "--workers", "0", "--keep-last", "1")


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 32 MB tmpfs: room for the run's checkpoint (~3 MB), and filled below until a second one cannot fit."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {made.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path, leave_bytes: int) -> None:
    free = shutil.disk_usage(disk).free
    with open(disk / "filler", "wb") as f:
        f.truncate(0)
        f.write(b"\0" * max(0, free - leave_bytes))  # tmpfs allocates what is written, not what is truncated


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_full_disk_at_save_stops_with_one_line_and_keeps_last(small_disk: Path, mode: str):
    out = small_disk / "run"
    extra = ("--async-save",) if mode == "async" else ()
    first = run(torchrun_cmd(2, "--epochs", "1", "--out", str(out), *FAST, *extra))
    assert first.returncode == 0, first.stderr[-2000:]
    before = sha256_file(out / "last.pt")

    fill(small_disk, leave_bytes=1 << 20)  # the next checkpoint needs ~3 MB
    second = run(torchrun_cmd(2, "--epochs", "3", "--out", str(out), *FAST, *extra), timeout=300)

    assert second.returncode != 0
    errors = [line for line in second.stderr.splitlines() if "[rank0] ERROR" in line]
    print(f"\nfull disk ({mode}): exit {second.returncode}; rank 0 said: {errors}")
    assert len(errors) == 1, second.stderr[-3000:]
    assert "No space left on device (ENOSPC)" in errors[0] and "last.pt is untouched" in errors[0]
    assert "[rank1] ERROR rank 0: cannot save" in second.stderr, "the other rank stops with the same reason"
    assert "]: Traceback" not in second.stderr, "no worker traceback (torchrun prefixes them with [rankN]:)"
    assert sha256_file(out / "last.pt") == before and load(out / "last.pt")["epoch"] == 1
    assert not list(out.glob(".*.tmp.*")), "the partial temporary is removed"

    (small_disk / "filler").unlink()  # room again: the same command resumes and finishes
    third = run(torchrun_cmd(2, "--epochs", "2", "--out", str(out), *FAST, *extra))
    assert third.returncode == 0, third.stderr[-2000:]
    assert load(out / "last.pt")["epoch"] == 2


def test_read_only_run_folder_is_refused_with_one_line(small_disk: Path):
    out = small_disk / "run"
    out.mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    # The trainer alone (torchrun reports its own status): 1, as for a full disk at save time.
    result = run([sys.executable, TRAIN, "--epochs", "1", "--out", str(out), *FAST], timeout=120)
    errors = [line for line in result.stderr.splitlines() if "ERROR" in line]
    assert result.returncode == 1, result.stderr[-2000:]
    assert len(errors) == 1 and "cannot write to the run folder" in errors[0] and "(EROFS)" in errors[0], result.stderr[
        -2000:
    ]
    assert os.listdir(out) == []
