"""The adaptive batcher in process (serve/model/batching.py): concurrent calls are batched, each caller gets its own
rows back, what queued while the model ran is the next batch, a caller that left is skipped, the model's
error reaches its batch's callers only, and overload is answered with 503."""

import asyncio
import threading
import time
from collections.abc import Callable

import anyio
import numpy as np
import pytest

from contract.errors import ClientError
from serve.model.batching import ModelBatcher, ModelFailed

BUSY_S = 0.3  # how long the first caller holds the event loop in the test of overlapping batches


def _times_ten_model(seconds: float = 0.0) -> tuple[Callable[[np.ndarray], np.ndarray], list[int]]:
    """A model that multiplies by ten (taking `seconds` a call), and the list of the batch sizes it was called with."""
    seen_batches: list[int] = []

    def model(batch: np.ndarray) -> np.ndarray:
        seen_batches.append(len(batch))
        time.sleep(seconds)
        return batch * 10

    return model, seen_batches


def test_concurrent_calls_are_batched_and_answered_in_their_own_rows():
    model, seen_batches = _times_ten_model()

    async def go():
        batcher = ModelBatcher(model, max_batch_size=16, max_latency_ms=5000)
        results = {}

        async def call(i: int):
            results[i] = await batcher(np.full((1, 3), float(i)))

        async with anyio.create_task_group() as tasks:
            for i in range(12):
                tasks.start_soon(call, i)
        return results

    results = anyio.run(go)
    for i, out in results.items():
        np.testing.assert_array_equal(out, np.full((1, 3), 10.0 * i))
    assert sum(seen_batches) == 12 and max(seen_batches) > 1, f"never batched: {seen_batches}"


def test_callers_of_different_row_counts_get_their_own_rows_of_every_output():
    """A batch's outputs (several, by name) are cut back into each caller's rows, however many each sent."""

    def model(batch: np.ndarray) -> dict[str, np.ndarray]:
        return {"times_ten": batch * 10, "first": batch[:, :1].copy()}

    async def go():
        batcher = ModelBatcher(model, max_batch_size=16, max_latency_ms=5000)
        results = {}

        async def call(i: int):
            results[i] = await batcher(np.arange(i * 3, dtype=np.float64).reshape(i, 3) + i)

        async with anyio.create_task_group() as tasks:
            for i in (1, 2, 3, 1, 4):
                tasks.start_soon(call, i)
        return results

    for i, out in anyio.run(go).items():
        sent = np.arange(i * 3, dtype=np.float64).reshape(i, 3) + i
        np.testing.assert_array_equal(out["times_ten"], sent * 10)
        np.testing.assert_array_equal(out["first"], sent[:, :1])


def test_overload_is_refused_with_503_and_the_rest_answered():
    """A model slower than the latency budget: the batcher refuses what it cannot answer in time, as 503."""

    def slow_model(batch: np.ndarray) -> np.ndarray:
        time.sleep(0.05)
        return batch + 1

    async def go():
        batcher = ModelBatcher(slow_model, max_batch_size=2, max_latency_ms=60)
        outcomes = []

        async def call(i: int):
            try:
                out = await batcher(np.full((1, 1), float(i)))
                outcomes.append("ok" if out[0, 0] == i + 1 else "wrong row")
            except ClientError as err:
                outcomes.append(err.status)
                assert err.retry_after_s is not None and 1 <= err.retry_after_s <= 60  # the 503's Retry-After

        for _ in range(3):
            async with anyio.create_task_group() as tasks:
                for i in range(16):
                    tasks.start_soon(call, i)
        return outcomes

    outcomes = anyio.run(go)
    assert set(outcomes) == {"ok", 503}, outcomes


def test_what_queues_while_the_model_runs_is_the_next_batch_and_a_caller_that_left_is_skipped():
    release = threading.Event()
    seen_batches = []

    def model(batch: np.ndarray) -> np.ndarray:
        seen_batches.append(batch[:, 0].tolist())
        release.wait(10)  # the first batch holds the model until every other call has queued
        return batch

    async def go():
        batcher = ModelBatcher(model, max_batch_size=4, max_latency_ms=10_000)
        answers = {}

        async def call(i: int):
            answers[i] = (await batcher(np.full((1, 1), float(i))))[0, 0]

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(call, 0)
            while not seen_batches:  # the model is running the first call alone
                await anyio.sleep(0.01)
            for i in range(1, 7):
                tasks.start_soon(call, i)
            with anyio.CancelScope() as leaver:
                leaver.cancel()
                await batcher(np.full((1, 1), 99.0))  # queued, then its caller is gone
            await anyio.sleep(0.05)
            release.set()
        return answers

    answers = anyio.run(go)
    assert answers == {i: float(i) for i in range(7)}
    assert seen_batches == [[0.0], [1.0, 2.0, 3.0, 4.0], [5.0, 6.0]], seen_batches


def test_the_next_batch_starts_before_the_answers_of_the_last_are_handled():
    """Answering a batch (in the server: sending each answer down the middlewares) occupies the event loop; the
    model must not wait for it. Here the first caller blocks the loop for BUSY_S once answered."""
    release = threading.Event()
    started_at: list[float] = []

    def model(batch: np.ndarray) -> np.ndarray:
        started_at.append(time.monotonic())
        release.wait(10)
        return batch

    async def go():
        batcher = ModelBatcher(model, max_batch_size=4, max_latency_ms=10_000)
        answered_at = {}

        async def call(i: int):
            await batcher(np.full((1, 1), float(i)))
            if i == 0:
                time.sleep(BUSY_S)  # the loop is busy: nothing else on it runs meanwhile
            answered_at[i] = time.monotonic()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(call, 0)
            while not started_at:
                await anyio.sleep(0.01)
            for i in range(1, 4):
                tasks.start_soon(call, i)
            await anyio.sleep(0.05)
            release.set()
        return answered_at

    answered_at = anyio.run(go)
    assert len(started_at) == 2, started_at
    assert started_at[1] < answered_at[0] - BUSY_S / 2, "the second batch waited for the first batch's answers"


def test_a_lane_runs_batch_after_batch_while_the_event_loop_is_busy():
    """The lanes take their batches themselves: with the event loop held (answers being sent, requests being
    read), what has queued still runs, batch after batch, instead of one batch per turn of the loop."""
    ran_at: list[float] = []

    def model(batch: np.ndarray) -> np.ndarray:
        ran_at.append(time.monotonic())
        time.sleep(0.01)
        return batch * 10

    async def go():
        batcher = ModelBatcher(model, max_batch_size=1, max_latency_ms=10_000)
        calls = [asyncio.ensure_future(batcher(np.full((1, 1), float(i)))) for i in range(4)]
        await asyncio.sleep(0)  # each call queued
        time.sleep(BUSY_S)  # the loop is busy: nothing else on it runs meanwhile
        held_until = time.monotonic()
        return await asyncio.gather(*calls), held_until

    answers, held_until = anyio.run(go)
    assert [a[0, 0] for a in answers] == [0.0, 10.0, 20.0, 30.0]
    assert len(ran_at) == 4 and ran_at[-1] < held_until, "a batch waited for the event loop's turn"


def test_a_model_error_fails_its_batch_only():
    def model(batch: np.ndarray) -> np.ndarray:
        if (batch < 0).any():
            raise RuntimeError("the runtime failed")
        return batch

    async def go():
        batcher = ModelBatcher(model, max_batch_size=8, max_latency_ms=10_000)
        with pytest.raises(ModelFailed, match="runtime failed") as failed:
            await batcher(np.full((1, 1), -1.0))
        assert isinstance(failed.value.cause, RuntimeError)
        return await batcher(np.full((2, 1), 3.0))

    np.testing.assert_array_equal(anyio.run(go), np.full((2, 1), 3.0))


def test_one_bad_request_in_a_batch_fails_alone_and_the_others_are_answered():
    """Security round 3, item 6: 120 good requests and one the model refuses, all at once: before, every request
    batched with the bad one failed with it."""
    seen_batches: list[int] = []

    def model(batch: np.ndarray) -> np.ndarray:
        seen_batches.append(len(batch))
        time.sleep(0.002)
        if (batch < 0).any():
            raise RuntimeError("index out of range")
        return batch * 10

    async def go():
        batcher = ModelBatcher(model, max_batch_size=32, max_latency_ms=10_000)
        outcomes: dict[int, object] = {}

        async def call(i: int):
            try:
                outcomes[i] = (await batcher(np.full((1, 1), -1.0 if i == 60 else float(i))))[0, 0]
            except ModelFailed as err:
                outcomes[i] = err

        async with anyio.create_task_group() as tasks:
            for i in range(121):
                tasks.start_soon(call, i)
        return outcomes

    outcomes = anyio.run(go)
    assert isinstance(outcomes.pop(60), ModelFailed)
    assert outcomes == {i: 10.0 * i for i in outcomes}, "a good request failed with the bad one"
    assert max(seen_batches) > 1, f"never batched: {seen_batches}"


def test_a_call_larger_than_a_batch_runs_alone_rather_than_stalling_the_queue():
    seen_batches = []

    def model(batch: np.ndarray) -> np.ndarray:
        seen_batches.append(len(batch))
        return batch

    async def go():
        batcher = ModelBatcher(model, max_batch_size=4, max_latency_ms=10_000)
        with anyio.fail_after(10):
            big = await batcher(np.ones((6, 1)))
            small = await batcher(np.ones((1, 1)))
        return big, small

    big, small = anyio.run(go)
    assert big.shape == (6, 1) and small.shape == (1, 1) and seen_batches == [6, 1]


def test_batches_are_padded_to_the_warmed_sizes_and_the_padding_dropped():
    """On a GPU every batch runs at one of a few sizes (pad_to): callers still get exactly their own rows."""
    model, seen_batches = _times_ten_model()

    async def go():
        batcher = ModelBatcher(model, max_batch_size=8, max_latency_ms=5000, pad_to=[1, 2, 4, 8])
        results = {}

        async def call(i: int, rows: int):
            results[i] = await batcher(np.full((rows, 3), float(i)))

        async with anyio.create_task_group() as tasks:
            for i in range(11):
                tasks.start_soon(call, i, 1 + i % 3)
        results["alone, three rows"] = await batcher(np.full((3, 3), 7.0))
        results["larger than any size"] = await batcher(np.full((9, 3), 5.0))
        return results

    results = anyio.run(go)
    for i in range(11):
        np.testing.assert_array_equal(results[i], np.full((1 + i % 3, 3), 10.0 * i))
    np.testing.assert_array_equal(results["alone, three rows"], np.full((3, 3), 70.0))
    np.testing.assert_array_equal(results["larger than any size"], np.full((9, 3), 50.0))
    assert seen_batches[-2:] == [4, 9], seen_batches  # three rows padded to four; nine run as they are
    assert set(seen_batches[:-1]) <= {1, 2, 4, 8}, seen_batches


class _Decoders:
    """An upstream as serve/decode_pool.DecodePool reports itself: requests in its hands, one decode's time."""

    def __init__(self, in_progress: int, threads: int = 2, seconds_each: float = 0.05) -> None:
        self.in_progress, self.threads, self.seconds_each = in_progress, threads, seconds_each

    def backlogged(self) -> bool:
        return self.in_progress > self.threads


async def _one_then_staggered(batcher: ModelBatcher, count: int) -> None:
    """One call (it measures the model's time per call), then `count` calls 10 ms apart."""
    await batcher(np.zeros((1, 3)))

    async def call(delay: float):
        await anyio.sleep(delay)
        await batcher(np.zeros((1, 3)))

    async with anyio.create_task_group() as tasks:
        for i in range(count):
            tasks.start_soon(call, 0.01 * i)


@pytest.mark.parametrize("in_progress", [8, 2])
def test_a_batch_waits_for_rows_still_being_decoded_only_while_decoders_are_backlogged(in_progress: int):
    """Requests arriving 10 ms apart at an idle model, behind decodes of 50 ms: with 8 requests in the decoders'
    hands (2 threads) the model waits and runs them as one batch; with 2 (no backlog) it runs each as it comes."""
    model, seen_batches = _times_ten_model()

    batcher = ModelBatcher(model, max_batch_size=16, max_latency_ms=5000, upstream=_Decoders(in_progress))
    anyio.run(_one_then_staggered, batcher, 4)
    if in_progress > 2:
        assert seen_batches == [1, 4], seen_batches
    else:  # each runs as it comes (two could share a batch only if the loop stalled for 10 ms)
        assert len(seen_batches) >= 4 and sum(seen_batches) == 5, seen_batches


def test_slow_decodes_cannot_stretch_the_hold_past_a_tenth_of_the_latency_budget():
    """Decodes of 10 s each (a client's huge uploads) would hold a batch 40 s; the budget's tenth (0.2 s) wins."""
    model, seen_batches = _times_ten_model()

    budget_s, decode_s = 2.0, 10.0

    async def go() -> float:
        batcher = ModelBatcher(
            model, max_batch_size=16, max_latency_ms=int(1000 * budget_s), upstream=_Decoders(8, seconds_each=decode_s)
        )
        await batcher(np.zeros((1, 3)))
        started = time.monotonic()
        await batcher(np.zeros((1, 3)))
        return time.monotonic() - started

    held = anyio.run(go)
    # Held a tenth of the budget (0.2 s); the bound is the budget itself, which a hold of four decodes (40 s) or even
    # one (10 s) would exceed whatever the machine's speed.
    assert seen_batches == [1, 1] and held < budget_s, (seen_batches, held)


def test_a_model_that_costs_far_more_than_a_decode_is_never_held():
    """Calls of 0.3 s beside decodes of 5 ms: the model is the bottleneck, and holding it for rows still being
    decoded would only idle it, so a request that finds it idle runs at once, even behind a backlog."""
    model, seen_batches = _times_ten_model(seconds=0.3)

    anyio.run(_one_then_staggered, ModelBatcher(model, 16, 5000, upstream=_Decoders(8, seconds_each=0.005)), 3)
    assert seen_batches == [1, 1, 2], seen_batches


def test_costly_requests_never_leave_the_batcher_refusing_everyone_after_them():
    """Security round 4, item 1: a few requests costing past the latency budget (a 26000 x 520 image for a
    segmenter) raised the shared time per row past the budget, and every request after them, an idle service's
    included, got 503 for good. Now an idle batcher takes a request whatever came before, and the time per row is
    the recent batches' median, so the costly few do not set the pace of the rest."""

    def model(batch: np.ndarray) -> np.ndarray:
        time.sleep(0.2 if batch[0, 0] < 0 else 0.001)  # a negative row is a costly one
        return batch + 1

    async def go():
        batcher = ModelBatcher(model, max_batch_size=1, max_latency_ms=100)
        for _ in range(3):  # costly requests, one after another: each runs (idle), each past the budget
            await batcher(np.full((1, 1), -1.0))
        costly = batcher.seconds_per_row
        normal = await batcher(np.full((1, 1), 2.0))  # the idle batcher takes it
        for _ in range(4):
            await batcher(np.full((1, 1), 2.0))
        return costly, normal, batcher.seconds_per_row

    costly, normal, median = anyio.run(go)
    assert costly > 0.1 and normal[0, 0] == 3.0 and median < 0.05


def test_a_batcher_that_refuses_every_request_says_so_and_recovers(monkeypatch):
    """A model call that never ends (a wedged runtime): every request after it is refused, and after
    REFUSING_UNREADY_S of that the batcher says so (the service then answers not ready); once the model answers
    again, or the refusals stop, it is ready."""
    import serve.model.batching as batching

    monkeypatch.setattr(batching, "REFUSING_UNREADY_S", 0.3)
    release = threading.Event()

    def model(batch: np.ndarray) -> np.ndarray:
        if batch[0, 0] < 0:
            release.wait(10)
        time.sleep(0.005)
        return batch + 1

    async def go():
        batcher = ModelBatcher(model, max_batch_size=1, max_latency_ms=20)
        await _first_answer(batcher, np.full((1, 1), 1.0))  # measured: fast
        refused = []
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(batcher, np.full((1, 1), -1.0))  # wedges the model
            await anyio.sleep(0.05)
            started = time.monotonic()
            while time.monotonic() - started < 0.6:
                tasks.start_soon(_refusal_of, batcher, np.full((1, 1), 1.0), refused)
                await anyio.sleep(0.02)
            said = batcher.refusing
            release.set()
        after = await batcher(np.full((1, 1), 1.0))
        return refused, said, batcher.refusing, after

    refused, said, then, after = anyio.run(go)
    assert refused and set(refused) == {503}
    assert said is not None and "every request refused" in said
    assert then is None and after[0, 0] == 2.0


async def _first_answer(batcher: ModelBatcher, rows: np.ndarray) -> np.ndarray:
    """The first answer of a batcher with a tight budget: on a loaded machine its lane's thread can take longer
    to start than the budget, and that first request is refused (as it should be); the next finds the lane."""
    for _ in range(20):
        try:
            return await batcher(rows)
        except ClientError:
            await anyio.sleep(0.05)
    raise AssertionError("the batcher never answered")


async def _refusal_of(batcher: ModelBatcher, rows: np.ndarray, refused: list) -> None:
    try:
        await batcher(rows)
    except ClientError as err:
        refused.append(err.status)


@pytest.mark.parametrize("lanes", [1, 2])
def test_with_two_lanes_a_request_runs_while_another_batch_is_still_running(lanes: int):
    """Lanes (serve/model/lanes.py): a request that comes while a batch runs takes a free lane at once; with one lane it
    waits for that batch to end."""
    release = threading.Event()
    running, most_at_once, batches = [0], [0], []
    lock = threading.Lock()

    def model(batch: np.ndarray) -> np.ndarray:
        with lock:
            running[0] += 1
            most_at_once[0] = max(most_at_once[0], running[0])
            batches.append(len(batch))
        if len(batches) == 1:
            release.wait(10)  # the first batch holds its lane until the second request has been seen
        with lock:
            running[0] -= 1
        return batch * 10

    async def go():
        batcher = ModelBatcher(model, max_batch_size=4, max_latency_ms=10_000, lanes=lanes)
        answers = {}

        async def call(i: int):
            answers[i] = await batcher(np.full((1, 1), float(i)))

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(call, 0)
            while not batches:
                await anyio.sleep(0.01)
            tasks.start_soon(call, 1)
            await anyio.sleep(0.2)
            second_ran_alongside = len(batches) == 2
            release.set()
        return answers, second_ran_alongside

    answers, second_ran_alongside = anyio.run(go)
    assert [answers[i][0, 0] for i in (0, 1)] == [0.0, 10.0]
    assert second_ran_alongside == (lanes == 2)
    assert most_at_once[0] == lanes and batches == [1, 1]
