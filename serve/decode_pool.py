"""Decoding and parsing off the event loop: one thread per core of this worker's share, so that CPU-bound work
never stalls the loop and at most that many large images are decoded (and held in memory) at once.

Handed over with asyncio's `run_in_executor`, which costs the loop less than anyio's `to_thread.run_sync`
with a capacity limiter (its checkpoints, cancel scope and limiter; docs/history.md has the measurement),
and a request cancelled while it waits for a thread (its deadline passed) is dropped before it runs.

The pool also says what is on its way to the model (serve/batching.py reads it): how many requests it holds
(decoding, or waiting for a thread), and how long one takes to decode.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class DecodePool:
    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.in_progress = 0  # requests handed to the pool and not yet back (changed on the event loop only)
        self.seconds_each: float | None = None  # one decode's time, a moving average
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="handoff-decode")

    async def run(self, work: Callable[..., T], *args: object, inline: bool = False) -> T:
        """`work(*args)` in one of the pool's threads; on the event loop itself where the caller says it is
        `inline` work, bounded small enough that handing it over would cost more (the hop costs the loop and the
        thread ~0.1 ms of CPU together)."""
        if inline:
            return work(*args)
        self.in_progress += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, self._timed, work, args)
        finally:
            self.in_progress -= 1

    def backlogged(self) -> bool:
        """More requests than threads: some wait for a decoder, which is then the bottleneck."""
        return self.in_progress > self.threads

    def _timed(self, work: Callable[..., T], args: tuple[object, ...]) -> T:
        started = time.perf_counter()
        try:
            return work(*args)
        finally:
            took = time.perf_counter() - started  # two threads may race here: one sample lost, no harm
            self.seconds_each = took if self.seconds_each is None else 0.9 * self.seconds_each + 0.1 * took
