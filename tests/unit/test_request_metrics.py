"""The request metrics' timing: an answer is counted before its last byte is sent (so /metrics, from whichever
worker, has counted it), and the gauges (requests in progress, the last request's time) follow within one turn of
the event loop. Real prometheus_client series, driven through the middleware as uvicorn calls it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from prometheus_client import REGISTRY

from serve.observability.request_metrics import RequestMetrics, _service_labels

PATH = "/classify"


def sample(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(f"bentoml_service_{name}", {**_service_labels(), **labels})
    return 0.0 if value is None else value


def answered() -> float:
    return sample("request_total", endpoint=PATH, http_response_code="200")


def test_an_answer_is_counted_before_it_is_sent_and_the_gauges_follow_within_a_turn():
    async def scenario() -> None:
        release = asyncio.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await release.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        counted_when_sent: list[float] = []

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                counted_when_sent.append(answered())

        metrics = RequestMetrics(app, known_paths=frozenset({PATH}))
        scope = {"type": "http", "method": "POST", "path": PATH, "headers": []}
        before, asked_at = answered(), time.time()
        requests = [asyncio.create_task(metrics(scope, None, send)) for _ in range(3)]
        for _ in range(3):  # the requests begin, and the loop turns
            await asyncio.sleep(0)
        assert sample("request_in_progress", endpoint=PATH) == 3
        assert sample("last_request_timestamp_seconds") >= asked_at
        release.set()
        await asyncio.gather(*requests)
        assert counted_when_sent == [before + 1, before + 2, before + 3], "each answer counted as its body went out"
        await asyncio.sleep(0)
        assert sample("request_in_progress", endpoint=PATH) == 0

    asyncio.run(scenario())


def test_a_request_whose_app_fails_leaves_the_count_in_progress_as_it_was():
    async def scenario() -> None:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            raise RuntimeError("the app failed")

        metrics = RequestMetrics(app, known_paths=frozenset({PATH}))
        try:
            await metrics({"type": "http", "method": "GET", "path": PATH, "headers": []}, None, None)
        except RuntimeError:
            pass
        await asyncio.sleep(0)
        assert sample("request_in_progress", endpoint=PATH) == 0

    asyncio.run(scenario())
