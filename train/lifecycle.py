"""How a worker's life ends.

- SIGTERM is a request to stop: the loop finishes its step, all ranks agree, rank 0 saves, then exit.
  Schedulers (SLURM, Kubernetes, torchrun itself when it shuts a job down) send SIGTERM before they
  kill; a checkpoint written in that grace period means no work is lost.
- A torchrun agent killed with SIGKILL leaves its workers running (they sit in their own process
  groups). A watchdog notices the agent is gone and ends the worker at once, without saving: a job
  restarted in the meantime owns the run folder now.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import FrameType

log = logging.getLogger(__name__)

EXIT_PREEMPTED = 128 + signal.SIGTERM  # what a shell reports for a process ended by SIGTERM


class StopRequest:
    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.requested:
            log.warning("SIGTERM received: saving a checkpoint at the end of this step, then exiting")
        self.requested = True


EXIT_ORPHANED = 3


def exit_when_orphaned(interval_s: float = 0.5) -> None:
    """Under torchrun, end this worker as soon as its agent (the parent process) is gone."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    agent = os.getppid()

    def watch() -> None:
        while os.getppid() == agent:
            time.sleep(interval_s)
        log.error("the torchrun agent (pid %d) is gone: exiting without saving, the run folder is not ours now", agent)
        logging.shutdown()
        os._exit(EXIT_ORPHANED)

    threading.Thread(target=watch, name="agent-watchdog", daemon=True).start()
