"""Adaptive batching, event-driven: the model runs one batch at a time, and a batch is everything that queued
while the previous one ran (up to the largest batch). A request that finds the model idle runs at once.

Why not BentoML's dispatcher (the CorkDispatcher behind `batchable=True`, which this module drove before):
it polls every millisecond, and waits on purpose for company by a wait it learns from past batches. After a
burst at concurrency 64 that learned wait stayed: lone requests then took 189 ms at p50 instead of 22 ms
(an A/B of the two, docs/benchmarks.md). Here nothing wakes unless a request arrives or a batch ends, and the
batch size follows the load by itself: one at a time when requests are rare, full batches when they queue.

On a GPU a batch is padded with zero rows up to the next of a few sizes (`pad_to`), the sizes the service
warms up before it reports ready. ONNX Runtime's CUDA provider searches cuDNN's convolution algorithms for
every new input shape (`cudnn_conv_algo_search` EXHAUSTIVE, its default). Unpadded, on an H200, resnet50 at
concurrency 16 gave 24 images/s (p50 638 ms) against 112 for a server that never batches: the figures point
to that search, paid under load by each of the 32 possible batch sizes the first time it came (not
profiled). The CPU has no such cost, and padding there would compute the zero rows for real, so the CPU
runs each batch at its own size.

Each lane is a thread that takes its batches from the queue itself: when a batch ends, the lane takes the next
(what queued meanwhile) at once and hands the answers of the last to the event loop, which sends them while the
model runs. The event loop only queues requests and sends answers; it is never between two batches. (When it was,
each batch waited for the loop's turn behind the answers being sent: 4 ms at the median between a text
classifier's batches at c=64, the lanes busy 93% of the time; docs/history.md.) On a CPU the model may run
several batches at once (`lanes`, chosen by serve/model/lanes.py), each lane on a session of one thread, so one request
runs while another lane's batch is still going. A lane's thread starts with the first request that finds no lane
free, and stays (a GPU runtime keeps per-thread state, which a new thread would build again).

Any model's requests carry named inputs (a dict of arrays) instead of one array, and only requests whose
inputs agree beyond the batch dimension (shapes and dtypes: the same sequence length) share a batch: padding a
shorter sequence would change what an unmasked model answers. A request of another shape waits for the next
batch, in its turn.

Where decoding is the bottleneck (12-megapixel photos, a cheap model), images reach an idle model one at a
time, and a batch of one costs the model nearly what a batch of eight does. So while requests wait for a decoder
(`upstream`, serve/model/decode_pool.py) and more of them are still being decoded than have queued, the next batch
waits for them, up to HOLD_DECODES decodes' time and never past a tenth of max_latency_ms. At low load nothing
waits for a decoder and nothing is held.

One request's bad input cannot fail the others: when a batch of several requests fails, it is run again in halves,
and the halves that fail in halves again, until each failing request has run alone; the others are answered from
the runs that passed, and a request that fails alone gets `ModelFailed` (any model's service answers it 400: an
out-of-vocabulary token id in 1 of 121 requests failed 62 of them before, security round 3). A failure costs
about log2(batch) extra runs of the batch's rows; a batch that passes costs nothing more.

Overload: a request is refused at once with 503 (its Retry-After: when the queue ahead will have drained) when the
model cannot finish it within max_latency_ms by the measured time per row, or when its turn comes after it has
already waited that long. The time per row is the median of the recent batches', so a few costly requests (a 26000
x 520 image) do not raise it for everyone after them, and a request that finds the model idle is always taken:
nothing it would wait for is ahead of it, and a refused request never runs, so an estimate kept up by refusals
would never come down (security round 4). A batcher that has refused every request for REFUSING_UNREADY_S says so
(`refusing`), and the service is not ready.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from contract.errors import ClientError
from serve.model.batch_shape import BatchShape, Rows, SameShape, rows_in, split_rows

log = logging.getLogger("bentoml.handoff.batching")

# The longest a batch waits for rows still being decoded, in decodes' time: 2 and 4 measured with
# bench/phone_photos.py, 4 served more ("Phone photos" in docs/serve.md).
HOLD_DECODES = 4
RECENT_BATCHES = 16  # the time per row is the median of this many recent batches'
REFUSING_UNREADY_S = 10.0  # refusing every request for this long (and lately): not ready
# Holds only where a decode costs at least this share of a model call: there the model is cheap beside decoding
# and the event loop, which keep the cores busy while it waits (the digits model on 400 x 300 JPEGs: a 1.4 ms
# decode, a ~8 ms call; fuller batches, 1.02-1.05 x at c=64). Where a call costs far more (resnet18 at 224 px:
# ~140 ms against a 3 ms decode) the model is the bottleneck, and a hold only idles it (0.85 x at c=16, A/B).
DECODE_OVER_MODEL_CALL = 0.1


class Upstream(Protocol):
    """Where the rows come from (serve/decode_pool.DecodePool): what is on its way to the model."""

    in_progress: int  # requests being decoded, or waiting for a decoder
    seconds_each: float | None  # one decode's time

    def backlogged(self) -> bool: ...


def _each(rows: Rows, change: Callable[[np.ndarray], np.ndarray]) -> Rows:
    return change(rows) if isinstance(rows, np.ndarray) else {name: change(a) for name, a in rows.items()}


class ModelFailed(Exception):
    """The model raised on a request's rows when they ran alone: `cause` is what it raised."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause

    def first_line(self) -> str:
        """The cause's first line (a runtime's error names the node and the bad value there), cut to 300 characters."""
        return (str(self.cause).strip().splitlines() or [type(self.cause).__name__])[0][:300]


def _average(average: float | None, sample: float) -> float:
    """A moving average over recent samples."""
    return sample if average is None else 0.8 * average + 0.2 * sample


@dataclass
class _Job:
    rows: Rows
    future: asyncio.Future[Rows]
    queued_at: float = field(default_factory=time.monotonic)
    key: tuple = ()
    size: int = 0

    def __post_init__(self) -> None:
        self.size = rows_in(self.rows)


class ModelBatcher:
    """`await batcher(rows)` -> the model's output for those N rows, batched with concurrent calls. Rows are an
    array N x ... (the model returns an array) or a dict of them, one per input (the model returns a dict)."""

    def __init__(
        self,
        model: Callable[[Any], Any],
        max_batch_size: int,
        max_latency_ms: int,
        pad_to: list[int] | None = None,
        upstream: Upstream | None = None,
        shape: BatchShape | None = None,
        lanes: int = 1,
    ) -> None:
        """`pad_to`: the batch sizes the model runs at (ascending); a batch is padded up to the next one.
        `upstream`: the decoders the rows come from; without it, a batch never waits for rows to come.
        `shape`: which requests may share a batch and how they are joined (SameShape by default).
        `lanes`: how many batches the model may run at once (`model` is then called from as many threads)."""
        self.model = model
        self.shape = shape or SameShape()
        self.upstream = upstream
        self.max_batch_size = max_batch_size
        self.pad_to = sorted(pad_to) if pad_to else None
        self.max_latency_s = max_latency_ms / 1000
        self.lanes = lanes
        # The queue and the lanes' counts are shared by the event loop (which queues) and the lanes (which take).
        self.arrived = threading.Condition(threading.Lock())
        self.queue: collections.deque[_Job] = collections.deque()
        self.queued_rows = 0
        self.live_lanes = 0  # lanes whose thread has started
        self.idle_lanes = 0  # of those, lanes waiting for requests (or holding for rows still being decoded)
        self.recent_per_row: collections.deque[float] = collections.deque(maxlen=RECENT_BATCHES)
        self.seconds_per_row: float | None = None  # their median, taken when a batch ends (not per request)
        self.refused_since: float | None = None  # when the refusals began that no answered request has ended
        self.refused_last = 0.0
        self.seconds_per_call: float | None = None  # one model call's time, whatever its batch's size
        self.running_until = 0.0  # when the batch started last is expected to end

    @property
    def refusing(self) -> str | None:
        """Why the service should not be sent requests: it has refused every one for REFUSING_UNREADY_S."""
        since, now = self.refused_since, time.monotonic()
        # Only while refusals go on: a service taken out of rotation gets no requests, and is ready again.
        if since is None or now - since < REFUSING_UNREADY_S or now - self.refused_last > REFUSING_UNREADY_S / 2:
            return None
        return f"overloaded: every request refused for {now - since:.0f}s (HANDOFF_MAX_LATENCY_MS)"

    def admit(self, rows: int) -> None:
        """Refuse `rows` now (503) if the model cannot finish them within the budget: before a request is decoded,
        so that a refusal under overload costs the decoders nothing."""
        if self._expected_wait_s(rows) > self.max_latency_s:
            raise self._overloaded()

    async def __call__(self, batch: Rows) -> Any:
        self.admit(rows_in(batch))
        job = _Job(batch, asyncio.get_running_loop().create_future(), key=self.shape.key(batch))
        with self.arrived:
            self.queue.append(job)
            self.queued_rows += job.size
            if self.idle_lanes:
                self.arrived.notify()  # a waiting lane takes it (or, holding, looks again)
            elif self.live_lanes < self.lanes:
                self.live_lanes += 1
                threading.Thread(target=self._lane, name="handoff-model-lane", daemon=True).start()
        return await job.future  # a cancelled caller cancels its future: the lane skips it

    def _expected_wait_s(self, rows: int) -> float:
        per_row = self.seconds_per_row
        running = max(0.0, self.running_until - time.monotonic())
        if per_row is None or (running == 0 and not self.queue):
            return 0.0  # nothing measured yet, or nothing ahead: accept (the turn-time check catches a long wait)
        return running + (self.queued_rows + rows) * per_row / self.lanes

    def _overloaded(self) -> ClientError:
        self.refused_last = time.monotonic()
        if self.refused_since is None:
            self.refused_since = self.refused_last
        # Retry when the queue ahead has drained (at least 1 s, at most a minute).
        retry_after_s = min(60, max(1, math.ceil(self._expected_wait_s(0))))
        return ClientError("overloaded: the model cannot answer within HANDOFF_MAX_LATENCY_MS", 503, retry_after_s)

    def _next_batch(self) -> tuple[list[_Job], list[_Job]]:
        """The queued jobs that fit in one batch, oldest first, all of the oldest one's shape, and the jobs that
        waited past the budget (to be refused). Jobs of another shape keep their place in the queue. Called with
        the queue's lock held."""
        jobs: list[_Job] = []
        expired: list[_Job] = []
        parts: list[Rows] = []  # the jobs' rows
        rows = 0
        now = time.monotonic()
        other_shapes: collections.deque[_Job] = collections.deque()
        # The oldest job always goes, even one larger than a batch (alone): a job the loop never took would
        # keep a lane taking nothing, forever.
        while self.queue:
            job = self.queue[0]
            if jobs and job.key != jobs[0].key:
                other_shapes.append(self.queue.popleft())
                continue
            if jobs and (rows + job.size > self.max_batch_size or not self.shape.fits(parts, job.rows)):
                break
            self.queue.popleft()
            self.queued_rows -= job.size
            if job.future.done():  # the caller left
                continue
            if now - job.queued_at > self.max_latency_s:
                expired.append(job)
                continue
            jobs.append(job)
            parts.append(job.rows)
            rows += job.size
        self.queue.extendleft(reversed(other_shapes))
        return jobs, expired

    def _lane(self) -> None:
        """One lane's thread: a batch at a time from the queue all lanes share, the answers handed to the event
        loop."""
        while True:
            with self.arrived:
                jobs, expired = self._take()
            if expired:
                _hand_over(expired, [self._overloaded()] * len(expired))
            if not jobs:
                continue
            try:
                outputs: list[Rows | Exception] = self._run_model([job.rows for job in jobs])
            except Exception as err:  # noqa: BLE001 - the batcher's own failure: every caller of the batch gets it
                log.exception("a batch failed outside the model")
                outputs = [err] * len(jobs)
            _hand_over(jobs, outputs)

    def _take(self) -> tuple[list[_Job], list[_Job]]:
        """With the lock held: the next batch (and the jobs refused on the way) once one is queued and not to be
        held for rows still being decoded (each arrival wakes a waiting lane to look again)."""
        while True:
            hold = self._hold_s()
            if self.queue and hold <= 0:
                return self._next_batch()
            self.idle_lanes += 1
            try:
                self.arrived.wait(hold if self.queue else None)
            finally:
                self.idle_lanes -= 1

    def _hold_s(self) -> float:
        """How much longer the next batch waits for rows still being decoded; 0: start it now."""
        upstream, call = self.upstream, self.seconds_per_call
        if upstream is None or upstream.seconds_each is None or call is None or not self.queue:
            return 0.0
        if not upstream.backlogged() or upstream.seconds_each < DECODE_OVER_MODEL_CALL * call:
            return 0.0
        if self.queued_rows >= min(self.max_batch_size, upstream.in_progress):
            return 0.0  # as many rows here as are still coming: a batch worth running
        waited = time.monotonic() - self.queue[0].queued_at
        # At most a tenth of the latency budget: a client's huge uploads (slow decodes) cannot stretch the hold.
        return max(0.0, min(HOLD_DECODES * upstream.seconds_each, self.max_latency_s / 10) - waited)

    def _padded(self, inputs: Rows) -> Rows:
        """`inputs` with zero rows added up to the next size in pad_to (as they are past the largest)."""
        rows = rows_in(inputs)
        size = next((s for s in self.pad_to or () if s >= rows), rows)
        if size == rows:
            return inputs
        return _each(inputs, lambda a: np.concatenate([a, np.zeros((size - rows, *a.shape[1:]), dtype=a.dtype)]))

    def _run_model(self, parts: list[Rows]) -> list[Rows | Exception]:
        """In the model thread: one batch of the callers' rows, joined (and padded) here, off the event loop, and
        each caller's share of the outputs; if it fails, each caller's own answer or failure (see the module)."""
        rows = sum(rows_in(part) for part in parts)
        started = time.monotonic()
        if self.seconds_per_row is not None:
            self.running_until = started + rows * self.seconds_per_row
        try:
            answers: list[Rows | Exception] = [*self._call(parts)]
        except Exception as err:  # noqa: BLE001 - whatever the model raises, find whose rows caused it
            return [ModelFailed(err)] if len(parts) == 1 else self._apart(parts)
        finally:
            self.running_until = 0.0  # idle again, until the next batch starts
            self.refused_since = None  # the model ran a request: the service is serving
        took = time.monotonic() - started
        self.recent_per_row.append(took / rows)
        self.seconds_per_row = statistics.median(self.recent_per_row)  # (NumPy's: 18 us for 16 numbers)
        self.seconds_per_call = _average(self.seconds_per_call, took)
        return answers

    def _call(self, parts: list[Rows]) -> list[Rows]:
        """Each caller's share of the outputs, the batch run in the calls its shape groups it into."""
        answers: dict[int, Rows] = {}
        for group in self.shape.groups(parts):
            members = [parts[i] for i in group]
            outputs = self._unpadded(self.model(self._padded(self.shape.join(members))), members)
            answers.update(zip(group, split_rows(outputs, [rows_in(part) for part in members]), strict=True))
        return [answers[i] for i in range(len(parts))]

    @staticmethod
    def _unpadded(outputs: Rows, parts: list[Rows]) -> Rows:
        """The outputs of `parts`' rows, the padding rows (pad_to) dropped."""
        rows = sum(rows_in(part) for part in parts)
        return _each(outputs, lambda a: a[:rows])

    def _apart(self, parts: list[Rows]) -> list[Rows | Exception]:
        """Two or more parts of a batch that failed, run in halves until each failing part has failed alone."""
        answers: list[Rows | Exception] = []
        half = len(parts) // 2
        for group in (parts[:half], parts[half:]):
            try:
                answers.extend(self._call(group))
            except Exception as err:  # noqa: BLE001 - some part of this group fails: look closer
                answers.extend([ModelFailed(err)] if len(group) == 1 else self._apart(group))
        return answers


def _hand_over(jobs: list[_Job], answers: list[Rows | Exception]) -> None:
    """From a lane: each job's answer (or exception) set on the event loop its caller waits on, in one callback."""
    try:
        jobs[0].future.get_loop().call_soon_threadsafe(settle, [job.future for job in jobs], answers)
    except RuntimeError:  # the loop has closed: no caller is left to answer
        pass


def settle(futures: list[asyncio.Future[Any]], answers: list[Any]) -> None:
    """On the event loop: each future given its answer, an exception raised in its caller, a future whose caller
    left skipped. How the lanes (and the decode pool's threads) answer what they were handed."""
    for future, answer in zip(futures, answers, strict=True):
        if future.done():  # the caller left
            continue
        if isinstance(answer, BaseException):
            future.set_exception(answer)
        else:
            future.set_result(answer)
