"""The checkpoint contract (see DESIGN.md) and the one class that writes, links and prunes checkpoints.

What a checkpoint holds is defined here once; export imports `FORMAT`, `load` and the key names.

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

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import logging
import os
import pickle
import random
import re
import socket
import time
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import torch

from train import distributed
from train.files import TMP_MARK, UnsafeRunFolder, check_run_folder, open_no_follow, publish, publish_link

log = logging.getLogger(__name__)

FORMAT = "handoff.checkpoint/1"
EMBEDDED_DIGITS = "embedded:digits"
LAST, BEST = "last.pt", "best.pt"
EPOCH_PATTERN = "epoch_{:04d}.pt"
REQUIRED_KEYS = ("format", "model", "optimizer", "scheduler", "epoch", "step", "best_acc1", "rng", "sampler", "meta")
META_KEYS = (
    "arch",
    "num_classes",
    "classes",
    "image_size",
    "mean",
    "std",
    "resize",
    "interpolation",
    "channels",
    "world_size",
    "torch",
    "created",
)


class CheckpointError(Exception):
    """A checkpoint that cannot be used, with a message fit for one line on stderr."""


# --- contents -----------------------------------------------------------------------------------


def capture_rng() -> dict[str, Any]:
    """This process's RNG states, in types `weights_only=True` accepts."""
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(_as_tuple(state["python"]))
    numpy_state = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": "MT19937",
            "state": {"key": numpy_state["key"].numpy().astype(np.uint32), "pos": numpy_state["pos"]},
            "has_gauss": numpy_state["has_gauss"],
            "gauss": numpy_state["gauss"],
        }
    )
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def make_meta(
    arch: str, classes: list[str], preprocessing: dict[str, Any], world_size: int, data: str
) -> dict[str, Any]:
    """Everything export needs to rebuild the model and its input pipeline with no flags."""
    return {
        "data": data,  # EMBEDDED_DIGITS or the ImageFolder root: where export finds real images for parity
        "arch": arch,
        "num_classes": len(classes),
        "classes": list(classes),
        "image_size": preprocessing["crop"],
        "mean": list(preprocessing["mean"]),
        "std": list(preprocessing["std"]),
        "resize": preprocessing["resize"],
        "interpolation": preprocessing["interpolation"],
        "channels": preprocessing["channels"],
        "world_size": world_size,
        "torch": str(torch.__version__),  # TorchVersion is a class: weights_only would refuse it
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


# --- reading ------------------------------------------------------------------------------------


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


def verify_zip_checksums(path: Path) -> None:
    """Check the CRC-32 that torch.save stores for every record of its zip container.

    torch.load does not check them, so a flipped bit inside tensor data would load silently as a
    wrong weight. Reading the file once more costs about a tenth of a second per 100 MB.
    Files in the legacy (non-zip) format carry no checksums and pass unchecked.
    """
    if not zipfile.is_zipfile(path):
        return
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
            # torch's zip reader returns a record flagged as a folder (MS-DOS attribute 0x10) as zeros.
            damaged = damaged or next(
                (i.filename for i in archive.infolist() if i.external_attr & 0x10 and not i.is_dir()), None
            )
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError) as err:
        raise CheckpointError(f"{path}: damaged zip container ({str(err)[:160] or type(err).__name__})") from None
    if damaged is not None:
        raise CheckpointError(
            f"{path}: damaged, the record {damaged} fails its checksum or zip directory entry "
            "(corrupted on disk or in transfer)"
        )


def read_weights_only(
    path: str | os.PathLike, map_location: Any = "cpu", safe_globals: tuple[Any, ...] | list[Any] = ()
) -> Any:
    """`torch.load(weights_only=True)` with one-line errors: missing, empty, damaged, or refused.
    `safe_globals`: harmless types to construct besides tensors and containers (torch's safe-globals list)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: the file is empty")
    verify_zip_checksums(path)
    try:
        with torch.serialization.safe_globals(list(safe_globals)):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        refused = re.search(r"unsupported (?:global: )?GLOBAL ([\w.]+)", str(err), re.IGNORECASE)
        if refused:
            raise PickleRefused(path, refused.group(1)) from None
        raise CheckpointError(
            f"{path}: not a readable checkpoint (damaged, truncated, or not a PyTorch file)"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError, IndexError, KeyError) as err:
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{path}: not a readable checkpoint, maybe truncated ({detail[:200]})") from None


_INTERPOLATIONS = ("nearest", "bilinear", "bicubic")


def check_meta(meta: Any, path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's `meta`, checked (keys, types, ranges) before anything is built from it."""

    def bad(key: str, why: str) -> CheckpointError:
        return CheckpointError(f"{path}: meta.{key} {why}")

    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: a handoff checkpoint without its meta (what export rebuilds the model from)")
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise CheckpointError(f"{path}: incomplete meta, missing {', '.join(missing)}")
    if not isinstance(meta["arch"], str) or not meta["arch"]:
        raise bad("arch", f"is {meta['arch']!r}, not an architecture name")
    for key, least in (("num_classes", 1), ("image_size", 8), ("resize", 8)):
        if type(meta[key]) is not int or not least <= meta[key] <= 8192:
            raise bad(key, f"is {meta[key]!r}, not an integer between {least} and 8192")
    if meta["resize"] < meta["image_size"]:
        raise bad("resize", f"{meta['resize']} is smaller than the image size {meta['image_size']}")
    if meta["channels"] != 3:
        raise bad("channels", f"is {meta['channels']!r}; handoff feeds RGB images (3 channels)")
    classes = meta["classes"]
    if (
        not isinstance(classes, list)
        or not all(isinstance(c, str) for c in classes)
        or len(classes) != meta["num_classes"]
    ):
        raise bad("classes", f"must list num_classes={meta['num_classes']} names (strings)")
    for key in ("mean", "std"):
        values = meta[key]
        if (
            not isinstance(values, list)
            or len(values) != 3
            or not all(isinstance(v, (int, float)) for v in values)
            or (key == "std" and min(values) <= 0)
        ):
            raise bad(key, f"is {values!r}, not 3 numbers" + (" above 0" if key == "std" else ""))
    if meta["interpolation"] not in _INTERPOLATIONS:
        raise bad("interpolation", f"is {meta['interpolation']!r}, not one of {', '.join(_INTERPOLATIONS)}")
    if "data" in meta and not isinstance(meta["data"], str):
        raise bad("data", f"is {meta['data']!r}, not a path")
    return meta


def load(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a handoff checkpoint safely (`weights_only=True`), or raise CheckpointError saying why not."""
    ckpt = read_weights_only(path, map_location)
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a handoff training checkpoint (expected format {FORMAT!r})")
    missing = [k for k in REQUIRED_KEYS if k not in ckpt]
    if missing:
        raise CheckpointError(f"{path}: incomplete checkpoint, missing {', '.join(missing)}")
    check_meta(ckpt["meta"], path)
    return ckpt


# --- writing ------------------------------------------------------------------------------------


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


def atomic_save(obj: Any, target: Path) -> None:
    """torch.save to a fresh temporary file beside `target`, fsync, then rename over it (train/files.py)."""

    def write(f: IO[bytes]) -> None:
        keeper = _WriteErrorKeeper(f)
        try:
            torch.save(obj, cast(IO[bytes], keeper))  # it has the write and flush torch.save uses
        except RuntimeError:
            if keeper.error is not None:
                raise keeper.error from None
            raise

    publish(target, write)


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


def lock_run_folder(folder: Path, wait_s: float) -> IO[str]:
    """Take RUN/.lock (an flock, released by the kernel when its owner dies) and write who holds it.

    Two jobs writing one run folder would clobber each other's checkpoints, e.g. a restarted job and the
    orphaned workers of the killed one. A dead owner's lock is free at once; a live one's is waited for
    `wait_s` seconds, then refused with the owner named.
    """
    handle = open_no_follow(folder / ".lock")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                handle.seek(0)
                owner = handle.read().strip() or "another process"
                handle.close()
                raise RunFolderBusy(
                    f"{folder} is in use by {owner}; two jobs must not write one run folder "
                    "(use another --out, or stop that job)"
                ) from None
            time.sleep(0.2)
    handle.seek(0)
    handle.truncate()
    handle.write(
        json.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "job": os.environ.get("TORCHELASTIC_RUN_ID"),
                "since": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            }
        )
    )
    handle.flush()
    return handle


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
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="checkpoint") if async_save and is_main else None
        self._in_flight: Future | None = None
        self._snapshots = SnapshotBuffers()
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
        if epoch_done and self.cfg.keep_last > 0:
            primary = folder / EPOCH_PATTERN.format(state["epoch"])
            atomic_save(state, primary)
            publish_link(primary, self.last)
        else:
            primary = self.last
            atomic_save(state, primary)
        if is_best:
            publish_link(primary, folder / BEST)
        if epoch_done:
            self._prune()
        log.debug("saved %s (epoch %d, step %d)", primary, state["epoch"], state["step"])

    def _prune(self) -> None:
        epoch_files = sorted(self.cfg.folder.glob(EPOCH_PATTERN.replace("{:04d}", "[0-9]*")))
        for old in epoch_files[: max(0, len(epoch_files) - self.cfg.keep_last)]:
            old.unlink(missing_ok=True)
