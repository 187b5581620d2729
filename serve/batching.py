"""Adaptive batching, event-driven: the model runs one batch at a time, and a batch is everything that queued
while the previous one ran (up to the largest batch). A request that finds the model idle runs at once.

Why not BentoML's dispatcher (the CorkDispatcher behind `batchable=True`, which this module drove before):
it polls every millisecond, and waits on purpose for company by a wait it learns from past batches. After a
burst at concurrency 64 that learned wait stayed: lone requests then took 189 ms at p50 instead of 22 ms
(an A/B of the two, README's Benchmarks). Here nothing wakes unless a request arrives or a batch ends, and the
batch size follows the load by itself: one at a time when requests are rare, full batches when they queue.

On a GPU a batch is padded with zero rows up to the next of a few sizes (`pad_to`), the sizes the service
warms up before it reports ready. ONNX Runtime's CUDA provider searches cuDNN's convolution algorithms for
every new input shape (`cudnn_conv_algo_search` EXHAUSTIVE, its default). Unpadded, on an H200, resnet50 at
concurrency 16 gave 24 images/s (p50 638 ms) against 112 for a server that never batches: the figures point
to that search, paid under load by each of the 32 possible batch sizes the first time it came (not
profiled). The CPU has no such cost, and padding there would compute the zero rows for real, so the CPU
runs each batch at its own size.

The model runs in a thread of its own, and when a batch ends the next one (what queued meanwhile) is handed to
it before the answers of the last are sent. The event loop spends about 1.3 ms of CPU on each answer
(bench/server_threads.py), some 40 ms for a batch of 32, which the model would otherwise wait out with every
batch at concurrency 64.

Overload: a request is refused at once with 503 when the model cannot finish it within max_latency_ms by
the measured time per row, or when its turn comes after it has already waited that long.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from bentoml.exceptions import ServiceUnavailable


@dataclass
class _Job:
    rows: np.ndarray
    future: asyncio.Future[np.ndarray]
    queued_at: float = field(default_factory=time.monotonic)


class ModelBatcher:
    """`await batcher(array N x ...)` -> the model's output for those N rows, batched with concurrent calls."""

    def __init__(
        self,
        model: Callable[[np.ndarray], np.ndarray],
        max_batch_size: int,
        max_latency_ms: int,
        pad_to: list[int] | None = None,
    ) -> None:
        """`pad_to`: the batch sizes the model runs at (ascending); a batch is padded up to the next one."""
        self.model = model
        self.max_batch_size = max_batch_size
        self.pad_to = sorted(pad_to) if pad_to else None
        self.max_latency_s = max_latency_ms / 1000
        # One model call at a time, in one thread: the runtime uses every core itself.
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="model")
        self.queue: collections.deque[_Job] = collections.deque()
        self.queued_rows = 0
        self.seconds_per_row: float | None = None  # measured: a moving average over recent batches
        self.running_until = 0.0  # when the batch now running is expected to end
        self.worker: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()

    async def __call__(self, batch: np.ndarray) -> np.ndarray:
        if self._expected_wait_s(len(batch)) > self.max_latency_s:
            raise self._overloaded()
        job = _Job(batch, asyncio.get_running_loop().create_future())
        self.queue.append(job)
        self.queued_rows += len(batch)
        if self.worker is None:  # started on the server's event loop, at the first request
            self.worker = asyncio.create_task(self._run_batches())
        self.wake.set()
        return await job.future  # a cancelled caller cancels its future: the worker skips it

    def _expected_wait_s(self, rows: int) -> float:
        if self.seconds_per_row is None:
            return 0.0  # nothing measured yet: accept, and let the turn-time check below catch a long wait
        running = max(0.0, self.running_until - time.monotonic())
        return running + (self.queued_rows + rows) * self.seconds_per_row

    @staticmethod
    def _overloaded() -> ServiceUnavailable:
        return ServiceUnavailable("overloaded: the model cannot answer within HANDOFF_MAX_LATENCY_MS")

    def _next_batch(self) -> list[_Job]:
        """The queued jobs that fit in one batch, oldest first; a job that waited past the budget is refused."""
        jobs: list[_Job] = []
        rows = 0
        now = time.monotonic()
        # The oldest job always goes, even one larger than a batch (alone): a job the loop never took would
        # keep the worker spinning on the event loop.
        while self.queue and (not jobs or rows + len(self.queue[0].rows) <= self.max_batch_size):
            job = self.queue.popleft()
            self.queued_rows -= len(job.rows)
            if job.future.done():  # the caller left
                continue
            if now - job.queued_at > self.max_latency_s:
                job.future.set_exception(self._overloaded())
                continue
            jobs.append(job)
            rows += len(job.rows)
        return jobs

    async def _run_batches(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            batch = self._start_next()
            while batch is not None:
                jobs, running = batch
                try:
                    outputs: np.ndarray | Exception = await running
                except Exception as err:  # noqa: BLE001 - every caller in the batch gets the model's error
                    outputs = err
                batch = self._start_next()  # before answering: the model need not wait for the answers to go out
                self._answer(jobs, outputs)

    def _start_next(self) -> tuple[list[_Job], asyncio.Future[np.ndarray]] | None:
        """The next batch handed to the model thread at once (no await in between), or None if nothing queued."""
        while self.queue:
            jobs = self._next_batch()
            if jobs:
                rows = [job.rows for job in jobs]
                running = asyncio.get_running_loop().run_in_executor(self.executor, self._run_model, rows)
                return jobs, running
        return None

    def _padded(self, inputs: np.ndarray) -> np.ndarray:
        """`inputs` with zero rows added up to the next size in pad_to (as they are past the largest)."""
        rows = len(inputs)
        size = next((s for s in self.pad_to or () if s >= rows), rows)
        if size == rows:
            return inputs
        return np.concatenate([inputs, np.zeros((size - rows, *inputs.shape[1:]), dtype=inputs.dtype)])

    def _run_model(self, parts: list[np.ndarray]) -> np.ndarray:
        """In the model thread: one batch of the callers' rows, joined (and padded) here, off the event loop."""
        rows = sum(len(part) for part in parts)
        started = time.monotonic()
        if self.seconds_per_row is not None:
            self.running_until = started + rows * self.seconds_per_row
        outputs = self.model(self._padded(np.concatenate(parts)))[:rows]
        per_row = (time.monotonic() - started) / rows
        self.seconds_per_row = per_row if self.seconds_per_row is None else 0.8 * self.seconds_per_row + 0.2 * per_row
        return outputs

    @staticmethod
    def _answer(jobs: list[_Job], outputs: np.ndarray | Exception) -> None:
        if isinstance(outputs, Exception):
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(outputs)
            return
        sizes = [len(job.rows) for job in jobs]
        for job, answer in zip(jobs, np.split(outputs, np.cumsum(sizes)[:-1]), strict=True):
            if not job.future.done():
                job.future.set_result(answer)
