"""The one class that saves, links, prunes and loads checkpoints, and its configuration."""

from __future__ import annotations

import logging
import re
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from train import distributed
from train.background import background_executor
from train.checkpoint.contents import BEST, EPOCH_PATTERN, LAST
from train.checkpoint.errors import CheckpointError, CheckpointWriteError
from train.checkpoint.lock import lock_run_folder
from train.checkpoint.reading import load
from train.checkpoint.writing import SnapshotBuffers, _reason, atomic_save, state_to_cpu
from train.files import TMP_MARK, Spare, UnsafeRunFolder, check_run_folder, publish_link

log = logging.getLogger(__name__)


@dataclass
class CheckpointConfig:
    """Where and how checkpoints are kept."""

    folder: Path
    keep_last: int = 3  # epoch files kept besides last.pt and best.pt; 0 keeps only those two
    lock_wait_s: float = 10.0  # how long to wait for the run folder's lock (orphans of a killed job exit in ~1 s)

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        if self.keep_last < 0:
            raise ValueError(f"--keep-last={self.keep_last}: must be 0 or more")


class Checkpointer:
    """Saves on global rank 0 only, keeps last.pt / best.pt / the last k epoch files, resumes.

    With async_save, `save` returns once the state is copied to CPU memory and a single background
    thread writes it; the next save, `wait` and `close` wait for it (at most one save in flight), and a
    write error surfaces there. The write itself is the same atomic one, so a crash mid-write loses
    nothing already committed.
    """

    def __init__(self, cfg: CheckpointConfig, is_main: bool, async_save: bool = False) -> None:
        self.cfg = cfg
        self.is_main = is_main
        self._writer = background_executor("checkpoint") if async_save and is_main else None
        self._in_flight: Future | None = None
        self._snapshots = SnapshotBuffers()
        self._spare = Spare(cfg.folder)  # a retired checkpoint file, written over by the next save
        self._lock: IO[str] | None = None
        self._saved: str | None = None  # what this job last saved, for the error message of a failed save
        if is_main:
            try:
                cfg.folder.mkdir(parents=True, exist_ok=True)
                check_run_folder(cfg.folder)
                self._lock = lock_run_folder(cfg.folder, cfg.lock_wait_s)
            except UnsafeRunFolder as err:
                raise CheckpointError(err.strerror) from None
            except OSError as err:
                raise CheckpointWriteError(f"cannot write to the run folder {cfg.folder}: {_reason(err)}") from None
            self._remove_stale_temporaries()  # safe only now: no other writer can be mid-save

    def load(self, resume: str) -> dict[str, Any] | None:
        """The checkpoint to resume from, on every rank (a collective): `auto` is RUN/last.pt when there is
        one, `none` starts afresh, anything else is a path. Rank 0 alone reads it and broadcasts it, so other
        nodes need not share its file system; a bad one is the same CheckpointError on every rank."""
        ckpt, error = None, None
        if self.is_main:
            try:
                path = self._resume_path(resume)
                if path is not None:
                    ckpt = load(path, map_location="cpu")
                    log.info("resuming from %s", path)
            except CheckpointError as err:
                error = f"--resume: {err}"
        ckpt, error = distributed.broadcast_object((ckpt, error))
        if error:
            raise CheckpointError(error)
        return ckpt

    def _resume_path(self, resume: str) -> Path | None:
        if resume == "none":
            return None
        if resume != "auto":
            return Path(resume)
        if self.last.is_symlink():  # the trainer writes last.pt as a file or a hard link, never a symlink
            raise CheckpointError(
                f"{self.last} is a symbolic link, which the trainer never writes; remove it or pass --resume PATH"
            )
        return self.last if self.last.is_file() else None

    @property
    def last(self) -> Path:
        return self.cfg.folder / LAST

    def _remove_stale_temporaries(self) -> None:
        """Temporaries left by a process killed mid-write: never a complete checkpoint, safe to drop."""
        for tmp in self.cfg.folder.glob(f".*{TMP_MARK}*"):
            log.info("removing %s, left by an interrupted save", tmp.name)
            tmp.unlink(missing_ok=True)

    def save(self, state: dict[str, Any], epoch_done: bool, is_best: bool) -> None:
        """Called on every rank; rank 0 writes (or hands the write to its thread), then tells every rank
        whether the save failed, so that a full disk stops the whole job with one clear error."""
        error: str | None = None
        if self.is_main:
            try:
                if self._writer is None:
                    self._write(state_to_cpu(state), epoch_done, is_best)
                else:
                    self.wait()
                    snapshot = self._snapshots.copy(state)
                    if torch.cuda.is_available():
                        torch.cuda.synchronize()  # the pinned copies are complete before training touches the originals
                    self._in_flight = self._writer.submit(self._write, snapshot, epoch_done, is_best)
            except CheckpointWriteError as err:
                error = str(err)
            except BaseException:
                distributed.broadcast_object("failed while saving a checkpoint (see its log)")
                raise
        error = distributed.broadcast_object(error)  # never leave the other ranks waiting on a failed save
        if error is not None:
            raise CheckpointWriteError(error if self.is_main else f"rank 0: {error}")

    def wait(self) -> None:
        """Block until the save in flight (if any) is on disk; re-raise its error."""
        if self._in_flight is not None:
            in_flight, self._in_flight = self._in_flight, None
            in_flight.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self._writer is not None:
                self._writer.shutdown(wait=True)
            self._spare.drop()
            if self._lock is not None:
                self._lock.close()  # releases the flock
                self._lock = None

    def _write(self, state: dict[str, Any], epoch_done: bool, is_best: bool) -> None:
        try:
            self._publish_all(state, epoch_done, is_best)
        except OSError as err:
            raise CheckpointWriteError(
                f"cannot save the checkpoint of epoch {state['epoch']}, step {state['step']} "
                f"in {self.cfg.folder}: {_reason(err)}; {LAST} is untouched"
                + (f" (it holds {self._saved})" if self._saved else "")
            ) from None
        self._saved = f"epoch {state['epoch']}, step {state['step']}"

    def _publish_all(self, state: dict[str, Any], epoch_done: bool, is_best: bool) -> None:
        folder = self.cfg.folder
        spare = self._spare.take()
        if epoch_done and self.cfg.keep_last > 0:
            primary = folder / EPOCH_PATTERN.format(state["epoch"])
            atomic_save(state, primary, reuse=spare)
            publish_link(primary, self.last)
        else:
            primary = self.last
            self._spare.keep_before_replace(primary)
            atomic_save(state, primary, reuse=spare)
        if is_best:
            self._spare.keep_before_replace(folder / BEST)
            publish_link(primary, folder / BEST)
        if epoch_done:
            self._prune()
        log.debug("saved %s (epoch %d, step %d)", primary, state["epoch"], state["step"])

    def _prune(self) -> None:
        """Keep the newest keep_last epoch files, by epoch number (as strings, epoch_10000 < epoch_9999)."""
        epoch_files = sorted(self.cfg.folder.glob(EPOCH_PATTERN.replace("{:04d}", "[0-9]*")), key=_epoch_number)
        for old in epoch_files[: max(0, len(epoch_files) - self.cfg.keep_last)]:
            self._spare.retire(old)


def _epoch_number(path: Path) -> int:
    match = re.search(r"(\d+)", path.name)
    return int(match.group(1)) if match else -1
