"""Refusals for load sent at once until they come faster than clients should send them, then paced
(serve/http/refusal_pace.py), through the router as a client sees them."""

import os
import time
import tracemalloc

import anyio
import pytest

from contract.errors import ClientError
from serve.http import router as router_module
from serve.http.endpoint import Answer
from serve.http.refusal_pace import RefusalPace
from tests.unit.test_router import make_client, post


def test_refusals_go_at_once_up_to_the_rate_then_each_waits_no_longer_than_its_retry_after(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("serve.http.refusal_pace.time.monotonic", lambda: clock[0])
    pace = RefusalPace(at_once_per_s=3, pause_s=0.5)
    assert [pace.pause_for(1) for _ in range(5)] == [0, 0, 0, 0.5, 0.5]
    assert pace.pause_for(0.2) == 0.2  # never past the client's own Retry-After
    clock[0] += 1.0  # a new second: at once again
    assert [pace.pause_for(1) for _ in range(4)] == [0, 0, 0, 0.5]


@pytest.mark.parametrize(
    "refusal, paced",
    [(ClientError("overloaded", 503, retry_after_s=1), True), (ClientError("bad image", 400), False)],
)
def test_a_flood_of_refusals_for_load_is_paced_and_other_errors_never_are(monkeypatch, refusal, paced):
    monkeypatch.setattr(router_module, "pace", RefusalPace(at_once_per_s=2, pause_s=0.3))

    async def refuse(request):
        raise refusal

    async def go():
        took = []
        async with make_client(handler=refuse) as client:
            for _ in range(4):
                started = time.perf_counter()
                response = await post(client, files={"image": ("a.png", b"x")})
                took.append(time.perf_counter() - started)
                assert response.status_code == refusal.status and "error" in response.json()
                assert (response.headers.get("retry-after") == "1") == paced
        return took

    took = anyio.run(go)
    assert max(took[:2]) < 0.25, took  # the first refusals of an overload go at once
    assert (min(took[2:]) >= 0.3) == paced, took


def test_a_body_refused_for_want_of_a_slot_is_let_go_before_its_paced_answer(monkeypatch):
    """No slot bounds a request refused after its body was read (429: too many in progress), so while its answer
    waits out the pace it must not hold that body: 3 refused uploads of 4 MB hold none of it in the server's code."""
    monkeypatch.setattr(router_module, "pace", RefusalPace(at_once_per_s=0, pause_s=0.5))
    release = anyio.Event()

    async def slow(request):
        await release.wait()
        return Answer(b"ok", "text/plain")

    def held_by_the_front_door() -> int:
        traces = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, "*serve/http/front_door.py"), tracemalloc.Filter(True, "*serve/http/form.py")]
        )
        return sum(stat.size for stat in traces.statistics("filename"))

    async def go():
        statuses, held = [], []
        async with make_client(max_concurrency=1, handler=slow, max_bytes=8 * 2**20) as client:
            async with anyio.create_task_group() as tasks:

                async def one():
                    upload = {"image": ("a.png", os.urandom(4 * 2**20))}
                    statuses.append((await post(client, files=upload)).status_code)

                for _ in range(4):
                    tasks.start_soon(one)
                await anyio.sleep(0.3)  # the first holds the one slot; the other three are refused and paced
                held.append(held_by_the_front_door())
                release.set()
        return sorted(statuses), held[0]

    tracemalloc.start()
    try:
        statuses, held = anyio.run(go)
    finally:
        tracemalloc.stop()
    assert statuses == [200, 429, 429, 429]
    assert 4 * 2**20 <= held < 6 * 2**20, f"{held / 2**20:.1f} MB held: the one request answered, not the refused"
