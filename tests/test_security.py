"""Attacks on the trainer's run folder: planted symlinks are never written through, and a folder any user
can write to is refused. (The service's and the exporter's attacks live beside their other tests.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import TRAIN, load, run


def train(out: Path, epochs: int = 1):
    """A short run that writes every file of a run folder (16 px, large batches: few cheap steps)."""
    args = ["--epochs", str(epochs), "--workers", "0", "--image-size", "16", "--batch-size", "128"]
    return run([sys.executable, TRAIN, *args, "--out", str(out)])


def test_planted_symlinks_in_the_run_folder_are_not_followed(tmp_path: Path):
    out, victim = tmp_path / "run", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("precious\n")
    (out / "last.pt").symlink_to(victim)  # read on resume: refused, never loaded
    result = train(out)
    assert result.returncode == 2 and "last.pt is a symbolic link" in result.stderr, result.stderr[-2000:]
    (out / "last.pt").unlink()
    for name in ("metrics.csv", "curves.png", "best.pt", "epoch_0001.pt", ".metrics.csv.tmp.0"):
        (out / name).symlink_to(victim)
    result = train(out)
    assert result.returncode == 0, result.stderr[-2000:]
    assert victim.read_text() == "precious\n", "a file outside the run folder was written through a link"
    for name in ("metrics.csv", "curves.png", "last.pt", "best.pt", "epoch_0001.pt"):
        assert not (out / name).is_symlink(), f"{name} is a link"
    assert load(out / "last.pt")["epoch"] == 1

    (out / ".lock").unlink()
    (out / ".lock").symlink_to(victim)  # opened in place, so refused rather than replaced
    result = train(out, epochs=2)
    assert result.returncode == 2 and "symbolic link" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and victim.read_text() == "precious\n"


def test_a_run_folder_any_user_can_write_to_is_refused(tmp_path: Path):
    out = tmp_path / "shared"
    out.mkdir()
    out.chmod(0o777)
    result = train(out)
    assert result.returncode == 2 and "can be written by any user" in result.stderr, result.stderr[-2000:]
    assert not (out / "last.pt").exists()


@pytest.mark.parametrize("trap", ["fifo", "empty"])
def test_a_fifo_or_an_empty_file_among_the_training_images_is_refused_when_scanned(tmp_path: Path, trap: str):
    """A FIFO named *.png blocked the trainer in open() forever (SIGTERM could not end it, the lock stayed held); a
    0-byte one crashed training mid-epoch (security round 3, low). Both are refused while the folder is scanned."""
    import os

    from PIL import Image

    data = tmp_path / "data"
    for split in ("train", "val"):
        for cls in ("a", "b"):
            (data / split / cls).mkdir(parents=True)
            Image.new("RGB", (8, 8), (40 if cls == "a" else 200, 0, 0)).save(data / split / cls / "0.png")
    if trap == "fifo":
        os.mkfifo(data / "train" / "a" / "trap.png")
    else:
        (data / "train" / "a" / "trap.png").write_bytes(b"")
    result = run(
        [sys.executable, TRAIN, "--epochs", "1", "--workers", "0", "--data", str(data), "--out", str(tmp_path / "r")],
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    reason = "is not a regular file" if trap == "fifo" else "is empty (0 bytes)"
    assert f"trap.png {reason}" in result.stderr and "Traceback" not in result.stderr


def test_class_folders_that_name_no_class_clearly_are_refused(tmp_path: Path):
    from PIL import Image

    data = tmp_path / "data"
    for split in ("train", "val"):
        for cls in ("cat", "cat "):  # two folders the page and every answer would show alike
            (data / split / cls).mkdir(parents=True)
            Image.new("RGB", (8, 8)).save(data / split / cls / "0.png")
    result = run(
        [sys.executable, TRAIN, "--epochs", "1", "--workers", "0", "--data", str(data), "--out", str(tmp_path / "r")],
        timeout=120,
    )
    assert result.returncode == 2 and "ends with whitespace" in result.stderr, result.stderr[-2000:]
