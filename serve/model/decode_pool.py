"""Decoding and parsing off the event loop: one thread per core of this worker's share, so that CPU-bound work
never stalls the loop and at most that many large images are decoded (and held in memory) at once.

The threads take their work from a queue themselves (a condition variable, as the model's lanes do in
serve/model/batching.py), and what they finish is handed back to the event loop in bulk: one callback sets the results
of every piece finished since the last, however many. asyncio's `run_in_executor`, which this pool used before,
wraps a concurrent future in an asyncio one and wakes the loop once per piece: a hop cost the loop ~29 us of CPU
against ~12 us here (a micro-benchmark of the two hops alone, 64 at a time on two threads; docs/history.md has
the served A/B). A request cancelled while its work waits for a thread (its deadline passed) is dropped before it
runs.

The pool also says what is on its way to the model (serve/model/batching.py reads it): how many requests it holds
(decoding, or waiting for a thread), and how long one takes to decode.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from serve.model.batching import settle

T = TypeVar("T")


class _Work:
    __slots__ = ("future", "work", "args", "answer")

    def __init__(self, future: asyncio.Future[Any], work: Callable[..., Any], args: tuple[object, ...]) -> None:
        self.future = future
        self.work = work
        self.args = args
        self.answer: Any = None  # what the work returned, or the exception it raised


class DecodePool:
    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.in_progress = 0  # requests handed to the pool and not yet back (changed on the event loop only)
        self.seconds_each: float | None = None  # one decode's time, a moving average
        self._queue: collections.deque[_Work] = collections.deque()
        self._arrived = threading.Condition()
        self._live = 0  # threads started (each on demand, and kept)
        self._idle = 0  # of those, threads waiting for work
        self._finished: list[_Work] = []  # done in a thread, not yet answered on the event loop
        self._finished_lock = threading.Lock()

    async def run(self, work: Callable[..., T], *args: object, inline: bool = False) -> T:
        """`work(*args)` in one of the pool's threads; on the event loop itself where the caller says it is
        `inline` work, bounded small enough that handing it over would cost more than doing it."""
        if inline:
            return work(*args)
        job = _Work(asyncio.get_running_loop().create_future(), work, args)
        with self._arrived:
            self._queue.append(job)
            if self._idle:
                self._arrived.notify()
            if len(self._queue) > self._idle and self._live < self.threads:
                self._live += 1
                threading.Thread(target=self._decoder, name="handoff-decode", daemon=True).start()
        self.in_progress += 1
        try:
            return await job.future  # a cancelled caller cancels it: the thread skips it
        finally:
            self.in_progress -= 1

    def backlogged(self) -> bool:
        """More requests than threads: some wait for a decoder, which is then the bottleneck."""
        return self.in_progress > self.threads

    def _decoder(self) -> None:
        """One thread: the oldest waiting work, its result (or exception) handed to the event loop."""
        while True:
            with self._arrived:
                while not self._queue:
                    self._idle += 1
                    try:
                        self._arrived.wait()
                    finally:
                        self._idle -= 1
                job = self._queue.popleft()
            if job.future.done():  # its request left while it waited
                continue
            try:
                job.answer = self._timed(job.work, job.args)
            except BaseException as err:  # noqa: BLE001 - whatever it is, it is the caller's answer
                job.answer = err
            with self._finished_lock:
                first = not self._finished
                self._finished.append(job)
            if first:  # a callback is already on its way for the others
                try:
                    job.future.get_loop().call_soon_threadsafe(self._answer)
                except RuntimeError:  # the loop has closed: no caller is left to answer
                    with self._finished_lock:
                        self._finished.clear()

    def _answer(self) -> None:
        """On the event loop: every finished piece's result set at once."""
        with self._finished_lock:
            finished, self._finished = self._finished, []
        settle([job.future for job in finished], [job.answer for job in finished])

    def _timed(self, work: Callable[..., T], args: tuple[object, ...]) -> T:
        started = time.perf_counter()
        try:
            return work(*args)
        finally:
            took = time.perf_counter() - started  # two threads may race here: one sample lost, no harm
            self.seconds_each = took if self.seconds_each is None else 0.9 * self.seconds_each + 0.1 * took
