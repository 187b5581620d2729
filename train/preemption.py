"""SIGTERM as a request to stop: the loop finishes its step, all ranks agree, rank 0 saves, then exit.

Schedulers (SLURM, Kubernetes, torchrun itself when it shuts a job down) send SIGTERM before they kill;
a checkpoint written in that grace period means no work is lost.
"""

from __future__ import annotations

import logging
import signal
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
