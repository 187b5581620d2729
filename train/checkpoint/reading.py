"""Reading a checkpoint safely: `weights_only=True` always, zip CRC-32s checked first, one-line errors."""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

from train.checkpoint.contents import FORMAT, REQUIRED_KEYS, check_meta
from train.checkpoint.errors import CheckpointError, PickleRefused


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
    if path.exists() and not path.is_file():  # a FIFO would block open(), /dev/zero never ends
        raise CheckpointError(f"{path}: not a regular file (a folder, FIFO, device or socket, or a link to one)")
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
