"""What can go wrong with a checkpoint, each with a message fit for one line on stderr."""

from __future__ import annotations

from pathlib import Path


class CheckpointError(Exception):
    """A checkpoint that cannot be used, with a message fit for one line on stderr."""


class RunFolderBusy(CheckpointError):
    """Another live process holds the run folder's lock."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (full disk, read-only or unwritable folder); nothing published was touched."""


class PickleRefused(CheckpointError):
    """The file holds pickled Python objects that `weights_only=True` will not construct."""

    def __init__(self, path: Path, global_name: str) -> None:
        super().__init__(
            f"{path}: holds pickled Python objects ({global_name}), which weights_only=True refuses to run"
        )
        self.global_name = global_name
