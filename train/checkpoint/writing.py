"""Writing a checkpoint: atomic saves (train/files.py), CPU snapshots for --async-save, errors with their errno."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import IO, Any, cast

import torch

from train.files import publish


class _WriteErrorKeeper:
    """A file whose first OSError is kept: torch.save reports a failed write (ENOSPC...) only as a
    RuntimeError about the stream position, which would hide the reason from the user."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file = file
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self.file.write(data)
        except OSError as err:
            self.error = self.error or err
            raise

    def flush(self) -> None:
        self.file.flush()


def atomic_save(obj: Any, target: Path, reuse: Path | None = None) -> None:
    """torch.save to a fresh temporary file beside `target` (or over the spare `reuse`), fsync, then rename over
    it (train/files.py)."""

    def write(f: IO[bytes]) -> None:
        keeper = _WriteErrorKeeper(f)
        try:
            torch.save(obj, cast(IO[bytes], keeper))  # it has the write and flush torch.save uses
        except RuntimeError:
            if keeper.error is not None:
                raise keeper.error from None
            raise

    publish(target, write, reuse)


def state_to_cpu(obj: Any) -> Any:
    """The state tree with every tensor on the CPU, so the checkpoint loads on any machine."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: state_to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(state_to_cpu(v) for v in obj)
    return obj


class SnapshotBuffers:
    """CPU copies of a state tree, in buffers kept from one save to the next.

    Reusing the buffers (pinned for GPU tensors) makes a snapshot one memcpy per tensor, without
    allocating and page-faulting ~200 MB of fresh memory each time: that is what the training loop
    waits for under --async-save. Safe because a snapshot is never overwritten while it is written.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}

    def copy(self, obj: Any, path: tuple = ()) -> Any:
        if isinstance(obj, torch.Tensor):
            buffer = self._buffers.get(path)
            if buffer is None or buffer.shape != obj.shape or buffer.dtype != obj.dtype:
                buffer = torch.empty(obj.shape, dtype=obj.dtype, pin_memory=obj.device.type == "cuda")
                self._buffers[path] = buffer
            return buffer.copy_(obj.detach(), non_blocking=True)
        if isinstance(obj, dict):
            return {k: self.copy(v, (*path, k)) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.copy(v, (*path, i)) for i, v in enumerate(obj))
        return obj


def _reason(err: OSError) -> str:
    """`No space left on device (ENOSPC)`: the words and the name to search for."""
    name = errno.errorcode.get(err.errno, "") if err.errno else ""
    return f"{err.strerror or err} ({name})" if name else str(err)
