"""Deadlines of one length, checked by one timer a tick instead of a timer armed and cancelled for each request.

Every request has two deadlines (its body's, serve/http/front_door.py, and its response's, serve/http/deadline.py), and
nearly every request meets both. `asyncio.timeout(seconds)` arms a timer on entry and cancels it on exit: at
c=64 on the digits model, arming, moving and cancelling them took ~9% of the event loop's samples (py-spy). Here
each deadline is an `asyncio.timeout(None)` (no timer of its own) recorded with the time it is due; one timer
a tick, running only while some deadline is recorded, expires those that are due (`reschedule` to now: the
request's task is cancelled where it entered the deadline, which raises TimeoutError there, as asyncio.timeout
does). Because every deadline of a sweep has the same length, the order they were recorded in is the order they
fall due, and a tick looks only at those due. A deadline expires up to a tick late: a tick is a tenth of the
length, at most 0.1 s.

A sweep also watches deadlines that are not a coroutine's: `record(key)` and `forget(key)`, with the sweep's
`on_due(key)` called when one falls due (serve/http/connections.py's deadlines for a fresh connection's first byte
and for a request's headers, armed at every request's first byte).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any

log = logging.getLogger("bentoml.handoff.deadlines")

MAX_TICK_S = 0.1


class SweptDeadline:
    """`async with sweep.deadline() as deadline:` cancels the body past the sweep's length (TimeoutError, and
    `deadline.expired()`), unless `sweep.forget(deadline)` first."""

    __slots__ = ("sweep", "timeout")

    def __init__(self, sweep: DeadlineSweep) -> None:
        self.sweep = sweep
        self.timeout = asyncio.timeout(None)

    def expired(self) -> bool:
        return self.timeout.expired()

    async def __aenter__(self) -> SweptDeadline:
        await self.timeout.__aenter__()
        self.sweep.record(self)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.sweep.forget(self)
        await self.timeout.__aexit__(kind, error, traceback)  # raises TimeoutError in place of its cancellation

    @staticmethod
    def due(deadline: SweptDeadline) -> None:
        """Its task is cancelled on the loop's next turn."""
        deadline.timeout.reschedule(asyncio.get_running_loop().time())


class DeadlineSweep:
    def __init__(self, seconds: float, on_due: Callable[[Any], None] = SweptDeadline.due) -> None:
        self.seconds = seconds
        self.on_due = on_due
        self.tick_s = min(MAX_TICK_S, seconds / 10)
        self.due: dict[Any, float] = {}  # recorded deadlines, in the order they fall due
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ticking: asyncio.TimerHandle | None = None

    def deadline(self) -> SweptDeadline:
        return SweptDeadline(self)

    def record(self, key: Any) -> None:
        """`key`'s deadline: `on_due(key)` the sweep's length from now, unless forgotten first."""
        loop = asyncio.get_running_loop()
        if loop is not self.loop:  # a sweep outlives an event loop only in tests: begin afresh on the new one
            self.loop, self.due, self.ticking = loop, {}, None
        self.due.pop(key, None)  # recorded again: due later, so last in the order
        self.due[key] = loop.time() + self.seconds
        if self.ticking is None:
            self.ticking = loop.call_later(self.tick_s, self._tick)

    def forget(self, key: Any) -> None:
        """No deadline from here on (a response has begun); entering and leaving it stays as cheap."""
        self.due.pop(key, None)

    def _tick(self) -> None:
        assert self.loop is not None
        now = self.loop.time()
        expired = []
        for key, due in self.due.items():
            if due > now:
                break
            expired.append(key)
        for key in expired:
            del self.due[key]
            try:
                self.on_due(key)
            except Exception:  # noqa: BLE001 - one deadline's fault must not stop the sweep for the others
                log.exception("a deadline's expiry failed")
        self.ticking = self.loop.call_later(self.tick_s, self._tick) if self.due else None
