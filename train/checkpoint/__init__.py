"""Checkpoints: what they hold (contents.py), how they are read (reading.py) and written (writing.py), the
run folder's lock (lock.py), and the Checkpointer that saves, prunes and loads them (checkpointer.py).
Export reads checkpoints through the same reader.

Guarantees:
- only global rank 0 writes; every other rank waits for its word, and a failed write (full disk,
  read-only folder) stops every rank with the same one-line reason;
- each file is written to a temporary name in the same folder, flushed, fsynced and `os.replace`d, so
  `last.pt` is always a complete checkpoint, whatever moment the process dies at;
- `last.pt` and `best.pt` are hard links to the epoch file when possible (no second write of the bytes);
- older epoch files are pruned only after the new one is safely in place;
- everything loads with `torch.load(..., weights_only=True)`: tensors, containers and plain scalars;
- reading checks the zip container's CRC-32s first, so a corrupted file is refused, never loaded wrong.
"""

from train.checkpoint.checkpointer import CheckpointConfig, Checkpointer
from train.checkpoint.contents import (
    BEST,
    EMBEDDED_DIGITS,
    EPOCH_PATTERN,
    FORMAT,
    LAST,
    META_KEYS,
    REQUIRED_KEYS,
    Progress,
    Trainables,
    capture_rng,
    check_meta,
    make_meta,
    restore_rng,
    restore_training_state,
    training_state,
)
from train.checkpoint.errors import CheckpointError, CheckpointWriteError, PickleRefused, RunFolderBusy
from train.checkpoint.lock import lock_run_folder
from train.checkpoint.reading import load, read_weights_only, verify_zip_checksums
from train.checkpoint.writing import SnapshotBuffers, atomic_save, state_to_cpu

__all__ = [
    "BEST",
    "EMBEDDED_DIGITS",
    "EPOCH_PATTERN",
    "FORMAT",
    "LAST",
    "META_KEYS",
    "REQUIRED_KEYS",
    "CheckpointConfig",
    "CheckpointError",
    "CheckpointWriteError",
    "Checkpointer",
    "PickleRefused",
    "RunFolderBusy",
    "SnapshotBuffers",
    "atomic_save",
    "capture_rng",
    "check_meta",
    "load",
    "lock_run_folder",
    "make_meta",
    "read_weights_only",
    "restore_rng",
    "state_to_cpu",
    "verify_zip_checksums",
    "Progress",
    "Trainables",
    "restore_training_state",
    "training_state",
]
