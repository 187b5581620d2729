"""Adaptive batching with BentoML's own dispatcher (the CorkDispatcher behind `batchable=True`), in-process.

Why not a `batchable=True` endpoint called through `self.to_async`: measured here (bench/serve_throughput.py,
resnet18 at 224 px), that self-call goes through BentoML's in-process HTTP proxy, which serialises each
image tensor to JSON (3x less throughput than a plain service) and, at 16 and 64 concurrent requests,
failed good requests with 500 ("Server disconnected" in the proxy). Driving the same dispatcher directly
keeps BentoML's adaptive batching algorithm and hands it arrays, not JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
import numpy as np
from bentoml._internal.marshal.dispatcher import CorkDispatcher
from bentoml.exceptions import ServiceUnavailable


class ModelBatcher:
    """`await batcher(array N x ...)` -> the model's output for those N rows, batched with concurrent calls."""

    def __init__(self, model: Callable[[np.ndarray], np.ndarray], max_batch_size: int, max_latency_ms: int) -> None:
        self.model = model
        self.limiter = anyio.CapacityLimiter(1)  # one model call at a time: the runtime uses every core itself
        dispatcher: CorkDispatcher[np.ndarray, np.ndarray] = CorkDispatcher(
            max_latency_ms,
            max_batch_size,
            fallback=self._overloaded,  # type: ignore[arg-type]
            get_batch_size=lambda array: array.shape[0],
            batch_dim=(0, 0),
        )
        self._call = dispatcher(self._run)

    @staticmethod
    def _overloaded() -> Exception:
        return ServiceUnavailable("overloaded: the batcher cannot answer within HANDOFF_MAX_LATENCY_MS")

    async def _run(self, items: Sequence[np.ndarray]) -> list[np.ndarray]:
        sizes = np.cumsum([len(item) for item in items])[:-1]
        outputs = await anyio.to_thread.run_sync(self.model, np.concatenate(items), limiter=self.limiter)
        return np.split(outputs, sizes)

    async def __call__(self, batch: np.ndarray) -> np.ndarray:
        result: Any = await self._call(batch)
        if isinstance(result, Exception):  # the dispatcher returns its fallback (overload) instead of raising it
            raise result
        return result
