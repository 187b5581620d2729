"""BentoML's adaptive dispatcher driven in process (serve/batching.py, the fenced private API): concurrent
calls are batched, each caller gets its own rows back, and overload is answered with 503."""

import time

import anyio
import numpy as np
from bentoml.exceptions import ServiceUnavailable

from serve.batching import ModelBatcher


def test_concurrent_calls_are_batched_and_answered_in_their_own_rows():
    seen_batches = []

    def model(batch: np.ndarray) -> np.ndarray:
        seen_batches.append(len(batch))
        return batch * 10

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


def test_overload_is_refused_with_503_and_the_rest_answered():
    """A model slower than the latency budget: the dispatcher refuses what it cannot answer in time. It hands
    its refusal back as a value; the batcher raises it, so the service answers 503 (it used to reach softmax)."""

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
            except ServiceUnavailable as err:
                outcomes.append(err.error_code.value)

        for _ in range(3):
            async with anyio.create_task_group() as tasks:
                for i in range(16):
                    tasks.start_soon(call, i)
        return outcomes

    outcomes = anyio.run(go)
    assert set(outcomes) == {"ok", 503}, outcomes
