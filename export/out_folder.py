"""The export folder: where the result goes, refused where replacing it could delete something that is not an
export, and swapped in whole once written (never a half-written folder)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from contract.manifest import MANIFEST, ManifestError, is_export_folder, read_manifest


def check_out(out: Path, checkpoint: Path) -> None:
    """Refuse an output folder whose replacement would delete something that is not an export."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ValueError(f"--out={out}: exists and is not a folder; choose another --out")
    resolved, source = out.resolve(), checkpoint.resolve()
    if resolved == source or resolved in source.parents:
        raise ValueError(f"--out={out}: holds the checkpoint being exported; choose another --out")
    if out.exists() and any(out.iterdir()) and not is_export_folder(out):
        raise ValueError(
            f"--out={out}: exists and is not an export folder (no handoff {MANIFEST}); export replaces "
            "only a previous export, so choose another --out or empty it yourself"
        )


def passed(folder: Path) -> bool:
    try:
        read_manifest(folder)
        return True
    except ManifestError:
        return False


def replace_folder(staging: Path, out: Path) -> None:
    """Swap the finished folder in: `out` is never a half-written export. Only an export is replaced: what is at
    `out` is moved aside first and checked there, where nothing else can swap it, because a folder may appear at
    `out` while the export runs (security round 3, item 11: check_out's check and the replace were two steps)."""
    if not (out.exists() or out.is_symlink()):
        try:
            staging.rename(out)  # replaces at most an empty folder that appeared meanwhile
            return
        except OSError:  # something put at `out` meanwhile is handled below like any existing folder
            if not out.exists():
                raise
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
    moved = old / out.name
    out.rename(moved)
    if moved.is_symlink() or not moved.is_dir() or (any(moved.iterdir()) and not is_export_folder(moved)):
        moved.rename(out)  # put back as it was; nothing deleted
        old.rmdir()
        raise ValueError(
            f"--out={out}: something that is not an export folder appeared there during the export; it is left as "
            f"it was, and the new export is not written; choose another --out"
        )
    staging.rename(out)
    shutil.rmtree(old)
