"""The export folder: where the result goes, refused where replacing it could delete something that is not an
export, and swapped in whole once written (never a half-written folder)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from export.manifest import MANIFEST, ManifestError, is_export_folder, read_manifest


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
    """Swap the finished folder in: `out` is never a half-written export. Only an export is replaced."""
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
        out.rename(old / out.name)
        staging.rename(out)
        shutil.rmtree(old)
    else:
        staging.rename(out)
