"""Writing into the run folder without following anything planted there.

Every file is written to a temporary beside its target with an unpredictable name, created exclusively
and never through a symlink (O_CREAT | O_EXCL | O_NOFOLLOW), flushed, fsynced, then `os.replace`d over the
target: the rename replaces whatever the target name held (a planted symlink included) and never writes
through it. Fixed names that are opened in place (the lock file) are opened with O_NOFOLLOW. A run folder
that any user may write to is refused: anyone could race the trainer there.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO

TMP_MARK = ".tmp."


class UnsafeRunFolder(OSError):
    """The run folder (or a name in it) is not safe to write: world-writable, or a planted symlink."""


def check_run_folder(folder: Path) -> None:
    mode = folder.stat().st_mode
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        raise UnsafeRunFolder(
            errno.EPERM,
            f"{folder} can be written by any user (mode {stat.filemode(mode)}): "
            "anyone could plant files the trainer would write through; `chmod o-w` it or "
            "choose another --out",
        )


def tmp_name(target: Path) -> Path:
    return target.with_name(f".{target.name}{TMP_MARK}{secrets.token_hex(8)}")


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(target: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Have `write` fill a fresh temporary beside `target`, then rename it over `target` and fsync the folder."""
    tmp = tmp_name(target)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def publish_link(source: Path, target: Path) -> None:
    """Make `target` name the same bytes as `source`, atomically (a hard link, or a copy where links fail)."""
    tmp = tmp_name(target)
    try:
        os.link(source, tmp, follow_symlinks=False)
    except OSError:
        with open(source, "rb") as src:
            publish(target, lambda f: shutil.copyfileobj(src, f))
        return
    try:
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def open_no_follow(path: Path, mode: str = "a+") -> IO[str]:
    """Open (creating) a file with a fixed name in place, refusing a symlink planted at that name."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnsafeRunFolder(
                errno.ELOOP,
                f"{path} is a symbolic link; the trainer does not write through links in its run folder (remove it)",
            ) from None
        raise
    return os.fdopen(fd, mode)
