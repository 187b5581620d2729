"""The Checkpointer's files: pruning keeps the newest epochs by number; writes never go through links;
--async-save writes a true snapshot, exactly as a synchronous save writes it."""

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
