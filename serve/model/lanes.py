"""How a CPU runs the model: how many batches at once (lanes), on how many threads each, and the largest batch
worth forming. Measured at load, on the model itself.

ONNX Runtime splits one call across its intra-op threads, and on a small model or a small batch those threads
spend much of the call waiting for each other. One session of one thread, called from several threads at once,
keeps every core busy instead (ONNX Runtime's `run` is thread-safe, and a one-thread session computes on the
calling thread; the weights are held once). Which arrangement is faster depends on the model and the host:
on a 2-core Xeon a ViT the size of DeiT-tiny ran 54 images/s as one call on both cores at batch 1 and 96 as two
calls of one thread each, and its rate fell at larger batches in both; a model large enough to keep its threads
busy gains less, and a lone request's call is up to twice as fast on two threads. So both are timed at the batch
sizes the service will run, and lanes are taken when they are faster at all where a lone request loses little on
one thread (LONE_SLOWDOWN), else only when they gain at least what a lone request loses, and clearly
(LANES_GAIN). The model's rate is not the service's: where the model is cheap beside the HTTP work around it (the
demo's digits model), the event loop sets the pace under load, lanes add nothing there, and a lone request pays
for them: two lanes of one thread answered it in 2.7-4.5 ms at the median, one lane of two in 2.1-2.3 ms, with
no fewer requests a second at c=64 (docs/history.md).

The choice is made once, at load: a host busy with other work at that moment may make it otherwise (/info shows
what was measured; HANDOFF_LANES fixes it). The model is timed on zeros, a dimension that is not fixed (a text
model's sequence length, a detector's image size) at FREE_DIMENSION: no request has come yet, and what is compared
is the two arrangements on one input, not the model's speed on the requests to come. A model whose lone call
already takes longer than LONGEST_CALL_S is not timed at all (its threads have work enough; timing it would hold up
the start): one lane on every thread. A task whose requests run alone (a detector's images of their own sizes) is
timed at batch 1 only.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contract.signature import Signature
from serve.config import ServeConfig
from serve.model.runtime import Runtime, RuntimeUnavailable

log = logging.getLogger("bentoml.handoff.lanes")

LANES_GAIN = 1.1
"""lanes are taken when their best rate is this much above one lane's, and above it by as much as a lone row's
call is slower on one thread: below that, a lone request's latency (one thread instead of all of them) is worth
more than the throughput"""
LONE_SLOWDOWN = 1.15
"""unless a call of one row is at most this much slower on one thread than on all of them: then lanes cost a lone
request little, and are taken when they are faster at all (a small text model gains 1.07-1.24 x on the sample,
~1.3 x on real texts, and lost that on the 1 start in 10 whose timing fell under LANES_GAIN; docs/history.md)"""
NEAR_BEST = 0.9
"""the batch cap is the largest batch whose rate is within this of the arrangement's best: batches are capped only
where larger ones are clearly slower (a ViT's attention on one thread), since a served batch also carries costs
the timing does not see (the batcher's and the event loop's work per call, a text batch's padding)"""
MIN_TIMED_S = 0.05
"""each arrangement and batch size is timed for at least two calls and this long"""
LONGEST_CALL_S = 0.25
"""a call that takes longer ends the climb to larger batches: its rate is already what batching can give, and
timing larger ones would hold up the service's start"""
FREE_DIMENSION = 64
"""the size given to a dimension that is not fixed when the model is timed (64 tokens, 64 x 64 pixels)"""


@dataclass(frozen=True)
class Lanes:
    """How the model runs, and why: /info's `cpu` (and `batching.batches_up_to`)."""

    count: int
    """batches the model runs at once"""
    threads: int
    """each call's intra-op threads"""
    max_batch_size: int
    """the largest batch the batcher forms (at most HANDOFF_MAX_BATCH_SIZE)"""
    chosen_by: str
    """"measured", "HANDOFF_LANES", or why nothing was measured"""
    rows_per_s: dict[str, dict[int, float]] = field(default_factory=dict)
    """what was measured: rows per second by arrangement ("1 x N threads", "N x 1 thread") and batch size"""

    def describe(self) -> dict[str, Any]:
        return {
            "lanes": self.count,
            "threads_per_lane": self.threads,
            "chosen_by": self.chosen_by,
            "rows_per_s": {
                name: {str(size): round(rate, 1) for size, rate in rates.items()}
                for name, rates in self.rows_per_s.items()
            },
        }


def sample_inputs(signature: Signature, rows: int) -> dict[str, np.ndarray]:
    """Zeros for every input at `rows` rows, a dimension that is not fixed at FREE_DIMENSION (token id 0 and a
    mask of zeros are valid inputs to every text model served)."""
    return {
        tensor.name: np.zeros((rows, *(d if d > 0 else FREE_DIMENSION for d in tensor.shape[1:])), tensor.dtype)
        for tensor in signature.inputs
    }


def rows_per_s(runtime: Runtime, inputs: dict[str, np.ndarray], lanes: int) -> tuple[float, float]:
    """Rows per second with `lanes` threads calling the runtime at once, and the slowest call's seconds. Each
    thread's first call is not timed (it allocates for the new shape)."""
    rows = len(next(iter(inputs.values())))
    counts, longest = [0] * lanes, [0.0] * lanes
    failures: list[Exception] = []
    start = threading.Barrier(lanes + 1)

    def lane(index: int) -> None:
        try:
            runtime.run_named(inputs)
        except Exception as err:  # noqa: BLE001 - handed to the caller below
            failures.append(err)
        start.wait()
        stop_at, calls = time.monotonic() + MIN_TIMED_S, 0
        while not failures and (calls < 2 or time.monotonic() < stop_at):
            began = time.monotonic()
            runtime.run_named(inputs)
            longest[index] = max(longest[index], time.monotonic() - began)
            calls += 1
        counts[index] = calls * rows

    threads = [threading.Thread(target=lane, args=(i,), name=f"lanes-{i}") for i in range(lanes)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.monotonic()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return sum(counts) / (time.monotonic() - began), max(longest)


def measure(
    arrangements: list[tuple[Runtime, int]], signature: Signature, buckets: list[int]
) -> list[dict[int, float]]:
    """Rows per second of each arrangement (a runtime and how many lanes call it) at each batch size. At each size
    the arrangements are timed in turn, so that whatever else the host does meanwhile weighs on them alike; each
    climbs to larger batches until one of its calls takes longer than LONGEST_CALL_S."""
    rates: list[dict[int, float]] = [{} for _ in arrangements]
    climbing = [True] * len(arrangements)
    for size in buckets:
        inputs = sample_inputs(signature, size)
        for index, (runtime, lanes) in enumerate(arrangements):
            if climbing[index]:
                rates[index][size], longest = rows_per_s(runtime, inputs, lanes)
                climbing[index] = longest <= LONGEST_CALL_S
        if not any(climbing):
            break
    return rates


def decide(one_lane: dict[int, float], lanes: dict[int, float], count: int, max_batch: int) -> Lanes:
    """The arrangement and batch cap from the two sweeps' rates (rows per second by batch size): one lane on
    `count` threads, or `count` lanes of one thread."""
    wide, narrow = f"1 x {count} threads", f"{count} x 1 thread"
    measured = {wide: one_lane, narrow: lanes}
    gain = max(lanes.values()) / max(one_lane.values())
    # a lone row's call on one thread against all of them (the lanes' rate at batch 1 is `count` such calls at once)
    lone_slowdown = one_lane[1] / (lanes[1] / count) if 1 in one_lane and 1 in lanes else math.inf
    use_lanes = gain > 1 and (lone_slowdown <= LONE_SLOWDOWN or gain >= max(LANES_GAIN, lone_slowdown))
    rates = lanes if use_lanes else one_lane
    best = max(rates.values())
    cap = max(size for size, rate in rates.items() if rate >= NEAR_BEST * best)
    return Lanes(count if use_lanes else 1, 1 if use_lanes else count, min(cap, max_batch), "measured", measured)


def arrange(
    config: ServeConfig, signature: Signature, load: Callable[[int], Runtime], runs_alone: bool = False
) -> tuple[Lanes, Runtime]:
    """The arrangement this worker serves with, and its runtime (`load(threads)` builds one): HANDOFF_LANES where
    set, else timed (a CPU, ONNX Runtime, two or more threads), else one lane on every thread. `runs_alone`: each
    request's rows run in a call of their own (timed at batch 1 only)."""
    threads, max_batch = config.model_threads(), config.max_batch_size
    if config.lanes is not None:
        runtime = load(max(1, threads // config.lanes))
        if config.lanes > 1 and (runtime.device != "cpu" or runtime.name != "onnx"):
            raise RuntimeUnavailable(
                f"HANDOFF_LANES={config.lanes}: several lanes run on a CPU with ONNX Runtime only "
                f"(this is {runtime.name} on {runtime.device}); unset it or set 1"
            )
        return Lanes(config.lanes, max(1, threads // config.lanes), max_batch, "HANDOFF_LANES"), runtime
    wide = load(threads)
    why_not = (
        "not a CPU" if wide.device != "cpu"
        else "not ONNX Runtime" if wide.name != "onnx"
        else "HANDOFF_CPU_THREADS" if config.cpu_threads is not None
        else "one core" if threads < 2
        else None
    )  # fmt: skip
    buckets = [1] if runs_alone else config.batch_buckets()
    try:
        if why_not is None:
            slowest = 1 / measure([(wide, 1)], signature, [1])[0][1]
            if slowest > LONGEST_CALL_S:
                why_not = f"one call takes {slowest:.2f} s"
    except Exception as err:  # noqa: BLE001 - a model that cannot run on zeros is served as it is, not timed
        why_not = f"the model failed on a sample ({type(err).__name__})"
    if why_not is not None:
        return Lanes(1, threads, max_batch, f"not measured: {why_not}"), wide
    narrow = load(1)
    one_lane, lanes = measure([(wide, 1), (narrow, threads)], signature, buckets)
    chosen = decide(one_lane, lanes, threads, max_batch)
    log.info("lanes: %s", chosen.describe())
    return chosen, (narrow if chosen.count > 1 else wide)
