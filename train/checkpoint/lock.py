"""The run folder's lock: two jobs must never write one run folder."""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import IO

from train.checkpoint.errors import RunFolderBusy
from train.files import open_no_follow


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
