"""Refusals for load sent at once until they come faster than clients should send them, then paced
(serve/refusal_pace.py), through the router as a client sees them."""

import time

import anyio
import pytest

from contract.errors import ClientError
from serve import router as router_module
from serve.refusal_pace import RefusalPace
from tests.unit.test_router import make_client, post


def test_refusals_go_at_once_up_to_the_rate_then_each_waits_no_longer_than_its_retry_after(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("serve.refusal_pace.time.monotonic", lambda: clock[0])
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
