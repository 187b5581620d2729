"""The Checkpointer's files: pruning keeps the newest epochs by number; writes never go through links;
--async-save writes a true snapshot, exactly as a synchronous save writes it; a retired file is written over by
a later save, a published one never."""

import io
import os
from pathlib import Path

import torch

from train.checkpoint import CheckpointConfig, Checkpointer, load


def state(epoch: int) -> dict:
    from contract.preprocessing import Preprocessing
    from train.checkpoint import EMBEDDED_DIGITS, FORMAT, make_meta

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


def mixed_tensors(epoch: int) -> dict:
    """Every kind of tensor a training state holds: weights, bf16, an int64 counter, a flag, an RNG byte
    state, a 0-dim scalar and an empty tensor."""
    return {
        "w": torch.full((3, 5), float(epoch)),
        "half": torch.full((7,), float(epoch), dtype=torch.bfloat16),
        "num_batches_tracked": torch.tensor(epoch, dtype=torch.int64),
        "mask": torch.tensor([True, False, epoch % 2 == 0]),
        "rng": torch.arange(epoch, epoch + 9, dtype=torch.uint8),
        "empty": torch.zeros(0, 4),
    }


def test_async_saves_write_the_state_as_it_was_when_save_returned(tmp_path: Path):
    """The background writer gets a snapshot: changing the tensors right after `save` returns changes nothing
    written, and each tensor comes back with its own storage, exactly as a synchronous save writes it."""
    savers = {
        mode: Checkpointer(CheckpointConfig(tmp_path / mode, keep_last=1), is_main=True, async_save=mode == "async")
        for mode in ("sync", "async")
    }
    try:
        for epoch in (1, 2, 3):
            saved = state(epoch)
            saved["model"] = mixed_tensors(epoch)
            for checkpointer in savers.values():
                checkpointer.save(saved, epoch_done=True, is_best=epoch == 2)
            for tensor in saved["model"].values():
                tensor.fill_(77)  # training goes on while the write is in flight
    finally:
        for checkpointer in savers.values():
            checkpointer.close()
    for name in ("last.pt", "best.pt"):
        written, reference = load(tmp_path / "async" / name), load(tmp_path / "sync" / name)
        assert written["epoch"] == reference["epoch"] == (3 if name == "last.pt" else 2)
        for key, expected in mixed_tensors(written["epoch"]).items():
            got = written["model"][key]
            assert got.dtype == expected.dtype and torch.equal(got, expected), key
            assert got.untyped_storage().nbytes() == got.nbytes, f"{key}: saved as a view of a larger storage"
    assert (tmp_path / "async" / "last.pt").stat().st_size == (tmp_path / "sync" / "last.pt").stat().st_size


def big_state(epoch: int, numel: int) -> dict:
    saved = state(epoch)
    saved["model"] = {"w": torch.full((numel,), float(epoch))}
    return saved


def test_a_pruned_epoch_file_is_written_over_by_a_later_save(tmp_path: Path):
    """Recycling (train/files.py, Spare): the file a prune retires takes the next save in place, even a smaller
    one (truncated to its own length), and the checkpoint reads back exactly, its CRCs checked."""
    checkpointer = Checkpointer(CheckpointConfig(tmp_path, keep_last=1), is_main=True)
    try:
        checkpointer.save(big_state(1, 50_000), epoch_done=True, is_best=False)
        first_inode = (tmp_path / "epoch_0001.pt").stat().st_ino
        checkpointer.save(big_state(2, 50_000), epoch_done=True, is_best=False)  # prunes epoch 1: the spare
        checkpointer.save(big_state(3, 1_000), epoch_done=True, is_best=False)
        assert (tmp_path / "epoch_0003.pt").stat().st_ino == first_inode
    finally:
        checkpointer.close()
    assert torch.equal(load(tmp_path / "last.pt")["model"]["w"], torch.full((1_000,), 3.0))
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".pt")) == ["epoch_0003.pt", "last.pt"]
    assert not [p for p in tmp_path.iterdir() if ".tmp." in p.name], "close() leaves no spare behind"


def test_a_published_checkpoint_is_never_written_over(tmp_path: Path):
    """best.pt keeps a pruned epoch file alive, and a failed save leaves last.pt linked to the spare it would have
    become: neither is ever taken as a spare."""
    checkpointer = Checkpointer(CheckpointConfig(tmp_path, keep_last=1), is_main=True)
    try:
        checkpointer.save(big_state(1, 5_000), epoch_done=True, is_best=True)
        for epoch in (2, 3, 4):
            checkpointer.save(big_state(epoch, 5_000), epoch_done=True, is_best=False)
    finally:
        checkpointer.close()
    assert torch.equal(load(tmp_path / "best.pt")["model"]["w"], torch.full((5_000,), 1.0))

    steps = Checkpointer(CheckpointConfig(tmp_path / "steps", keep_last=0), is_main=True)
    try:
        steps.save(big_state(1, 5_000), epoch_done=False, is_best=False)
        with open(tmp_path / "steps" / "last.pt", "rb") as first:  # the file itself, whatever names it later
            failing = big_state(2, 5_000)
            failing["unpicklable"] = lambda: None
            try:
                steps.save(failing, epoch_done=False, is_best=False)
            except Exception:  # noqa: BLE001 - pickling a lambda fails; what matters is what the disk holds
                pass
            steps.save(big_state(3, 5_000), epoch_done=False, is_best=False)
            steps.save(big_state(4, 5_000), epoch_done=False, is_best=False)
            first_bytes = first.read()
    finally:
        steps.close()
    assert torch.load(io.BytesIO(first_bytes), weights_only=True)["epoch"] == 1
    assert load(tmp_path / "steps" / "last.pt")["epoch"] == 4


def test_a_spare_never_follows_a_link(tmp_path: Path):
    """A symlink where a spare or a retired file should be is dropped, never written through: the file it points
    at keeps its bytes, and the save lands in a fresh file."""
    from train.files import Spare, publish

    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not ours")
    run = tmp_path / "run"
    run.mkdir()

    planted = run / "epoch_0001.pt"
    planted.symlink_to(outside)
    spare = Spare(run)
    spare.retire(planted)  # a link is not a file of ours to keep
    assert spare.take() is None and not planted.is_symlink()

    planted_spare = run / ".spare.tmp.planted"
    planted_spare.symlink_to(outside)
    publish(run / "last.bin", lambda f: f.write(b"checkpoint"), reuse=planted_spare)
    assert (run / "last.bin").read_bytes() == b"checkpoint" and not (run / "last.bin").is_symlink()
    assert outside.read_bytes() == b"not ours" and not os.path.lexists(planted_spare)
