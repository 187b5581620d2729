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


def publish(target: Path, write: Callable[[IO[bytes]], None], reuse: Path | None = None) -> None:
    """Have `write` fill a fresh temporary beside `target` (or, given `reuse`, a spare file of ours written over in
    place; see Spare), then rename it over `target` and fsync the folder."""
    opened = _open_spare(reuse) if reuse is not None else None
    if opened is None:
        fresh = tmp_name(target)
        opened = fresh, os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    tmp, fd = opened
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.truncate()  # a reused file may have been longer
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def _open_spare(spare: Path) -> tuple[Path, int] | None:
    """The spare opened for writing in place, if it is still a regular file that no other name links to (so
    writing over it cannot touch a published checkpoint); else its name is dropped and None."""
    try:
        fd = os.open(spare, os.O_WRONLY | os.O_NOFOLLOW)
    except OSError:
        fd = None
    if fd is not None:
        if _alone(os.fstat(fd)):
            return spare, fd
        os.close(fd)
    spare.unlink(missing_ok=True)
    return None


class Spare:
    """At most one retired file of the run folder, kept under a temporary name to be written over by the next save.

    Writing a checkpoint into a fresh file and freeing the one it retires costs the machine far more than
    writing over a file whose blocks and cached pages already exist (90 MB: 35-60 ms of CPU against 15-18 ms
    here, the block allocation, the freeing and the discard): PostgreSQL recycles its WAL segments for the same
    reason. Only a file no other name links to is kept or written into, so a published checkpoint (last.pt and
    best.pt are hard links to epoch files) is never touched. The name carries TMP_MARK, so a spare left by a
    killed job is removed with the other temporaries when the next one starts.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._path: Path | None = None

    def take(self) -> Path | None:
        """The spare to write the next save into (publish's `reuse`), if there is one; it is no longer kept."""
        path, self._path = self._path, None
        return path

    def retire(self, path: Path) -> None:
        """Remove `path` from the folder, keeping its file as the spare when there is none and no other name
        links to it."""
        if self._path is None and _alone_at(path):
            self._path = self._new_name()
            os.rename(path, self._path)
        else:
            path.unlink(missing_ok=True)

    def keep_before_replace(self, path: Path) -> None:
        """Called before `path` is renamed over: link its file to a spare name, so that it is kept rather than
        freed. Should the replacement fail, the spare still shares the file with `path` and is never written."""
        if self._path is None and _alone_at(path):
            spare = self._new_name()
            os.link(path, spare, follow_symlinks=False)
            self._path = spare

    def _new_name(self) -> Path:
        return tmp_name(self.folder / "spare")

    def drop(self) -> None:
        if self._path is not None:
            self._path.unlink(missing_ok=True)
            self._path = None


def _alone(info: os.stat_result) -> bool:
    """A regular file (not a link planted there) that no other name links to."""
    return stat.S_ISREG(info.st_mode) and info.st_nlink == 1


def _alone_at(path: Path) -> bool:
    try:
        return _alone(path.lstat())
    except FileNotFoundError:
        return False


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
