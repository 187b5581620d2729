"""Decoding and parsing off the event loop: one thread per core of this worker's share, so that CPU-bound work
never stalls the loop and at most that many large images are decoded (and held in memory) at once.

Handed over with asyncio's `run_in_executor`, which costs the loop less than anyio's `to_thread.run_sync`
with a capacity limiter (its checkpoints, cancel scope and limiter; `bench/handoff_cost.py` measures both),
and a request cancelled while it waits for a thread (its deadline passed) is dropped before it runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class DecodePool:
    def __init__(self, threads: int) -> None:
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="handoff-decode")

    async def run(self, work: Callable[..., T], *args: object) -> T:
        """`work(*args)` in one of the pool's threads."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, work, *args)
