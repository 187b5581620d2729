"""The Checkpointer's files: pruning keeps the newest epochs by number; writes never go through links."""

from pathlib import Path

import torch

from train.checkpoint import CheckpointConfig, Checkpointer, load


def state(epoch: int) -> dict:
    from train.checkpoint import EMBEDDED_DIGITS, FORMAT, make_meta
    from train.preprocessing import Preprocessing

    meta = make_meta("resnet18", ["a", "b"], Preprocessing(crop=8, resize=8), 1, EMBEDDED_DIGITS)
    return {
        "format": FORMAT,
        "model": {"w": torch.full((2,), float(epoch))},
        "optimizer": {},
        "scheduler": {},
        "epoch": epoch,
        "step": epoch * 10,
        "best_acc1": 0.0,
        "rng": [],
        "sampler": {"epoch": epoch, "position": 0},
        "meta": meta,
    }


def test_pruning_keeps_the_newest_epochs_by_number(tmp_path: Path):
    checkpointer = Checkpointer(CheckpointConfig(tmp_path, keep_last=2), is_main=True)
    try:
        for epoch in (9998, 9999, 10000, 10001):
            checkpointer.save(state(epoch), epoch_done=True, is_best=epoch == 9999)
    finally:
        checkpointer.close()
    names = sorted(p.name for p in tmp_path.glob("epoch_*.pt"))
    assert names == ["epoch_10000.pt", "epoch_10001.pt"], "as strings, epoch_10000 would sort before epoch_9999"
    assert load(tmp_path / "last.pt")["epoch"] == 10001 and load(tmp_path / "best.pt")["epoch"] == 9999


def test_a_planted_link_is_replaced_not_written_through(tmp_path: Path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    run = tmp_path / "run"
    run.mkdir()
    (run / "last.pt").symlink_to(victim)
    checkpointer = Checkpointer(CheckpointConfig(run, keep_last=0), is_main=True)
    try:
        checkpointer.save(state(1), epoch_done=True, is_best=False)
    finally:
        checkpointer.close()
    assert victim.read_text() == "keep" and not (run / "last.pt").is_symlink()
