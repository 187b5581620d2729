"""Two reference savers that bench/ddp_epochs.py times beside the trainer's Checkpointer, so that what an async save
costs the epoch can be read against what no saver could avoid. Both have the Checkpointer's `save`, `wait` and
`close`, and make the same collective per save (rank 0 tells every rank whether it failed).

- ControlSaver saves nothing: the epoch still builds the state dicts and makes the collective, so its figure
  is the measurement's own floor (an A/A test: anything it shows above 1.0 is noise or harness).
- RawBytesSaver is the cheapest asynchronous writer of the same bytes: the snapshot into kept buffers (as the
  Checkpointer's), then the tensors' raw bytes written by a background thread at the lowest priority the way
  the Checkpointer writes (over a retired file, fsynced, renamed into place; train/files.py). No format, no
  CRC, no metadata, so it cannot be loaded; it prices the copy and the I/O alone, which any async checkpointer
  (DCP's async_save included) also pays.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import IO, Any

import torch

from train import distributed
from train.background import background_executor
from train.checkpoint.writing import SnapshotBuffers
from train.files import Spare, publish


def tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a state tree, depth first."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from tensors(value)


class ControlSaver:
    """Saves nothing; makes the per-save collective alone."""

    def save(self, state: dict[str, Any], epoch_done: bool, is_best: bool) -> None:
        distributed.broadcast_object(None)

    def wait(self) -> None:
        pass

    def close(self) -> None:
        pass


class RawBytesSaver:
    """Snapshot, then the raw tensor bytes written, fsynced and renamed by a lowest-priority thread on rank 0."""

    def __init__(self, folder: Path, is_main: bool) -> None:
        self.folder = folder
        self.is_main = is_main
        self._snapshots = SnapshotBuffers()
        self._spare = Spare(folder)
        self._writer = background_executor("raw-bytes") if is_main else None
        self._in_flight: Future | None = None
        if is_main:
            folder.mkdir(parents=True, exist_ok=True)

    def save(self, state: dict[str, Any], epoch_done: bool, is_best: bool) -> None:
        if self._writer is not None:
            self.wait()
            snapshot = self._snapshots.copy(state)
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # the pinned copies are complete before training touches the originals
            self._in_flight = self._writer.submit(self._write, snapshot)
        distributed.broadcast_object(None)

    def _write(self, snapshot: dict[str, Any]) -> None:
        def write(f: IO[bytes]) -> None:
            for tensor in tensors(snapshot):
                f.write(tensor.numpy().data.cast("B"))  # the bytes themselves, no copy on the way

        target, spare = self.folder / "last.bin", self._spare.take()
        self._spare.keep_before_replace(target)
        publish(target, write, reuse=spare)  # as the Checkpointer writes: in place over a retired file, fsynced

    def wait(self) -> None:
        if self._in_flight is not None:
            in_flight, self._in_flight = self._in_flight, None
            in_flight.result()

    def close(self) -> None:
        self.wait()
        if self._writer is not None:
            self._writer.shutdown(wait=True)
        self._spare.drop()
