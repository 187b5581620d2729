"""The request deadline (serve/http/deadline.py) in process, with httpx's ASGI transport in front of tiny apps."""

import asyncio

import httpx
import pytest

from serve.http.deadline import ResponseDeadline


def answer_after(seconds: float, then_stream: float = 0.0):
    async def app(scope, receive, send):
        await asyncio.sleep(seconds)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await asyncio.sleep(then_stream)  # a response already begun is never cut off
        await send({"type": "http.response.body", "body": b"done"})

    return app


async def get(app, timeout: float) -> httpx.Response:
    transport = httpx.ASGITransport(app=ResponseDeadline(app, timeout=timeout))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.get("/")


def test_a_request_past_the_deadline_gets_504_and_is_cancelled():
    cancelled = []

    async def stuck(scope, receive, send):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    response = asyncio.run(get(stuck, timeout=0.2))
    assert response.status_code == 504 and "0.2 seconds" in response.json()["error"]
    assert cancelled


def test_a_response_begun_in_time_is_never_cut_off():
    response = asyncio.run(get(answer_after(0.05, then_stream=0.4), timeout=0.2))
    assert response.status_code == 200 and response.content == b"done"


def test_the_apps_own_timeout_error_is_not_mistaken_for_the_deadline():
    async def raises(scope, receive, send):
        raise TimeoutError("the app's own")

    with pytest.raises(TimeoutError, match="the app's own"):
        asyncio.run(get(raises, timeout=5))


def test_an_answered_request_leaves_no_timer_behind():
    """BentoML's own middleware left each request's timer on the loop until its timeout passed."""

    async def fifty_requests() -> list:
        for _ in range(50):
            assert (await get(answer_after(0), timeout=600)).status_code == 200
        loop = asyncio.get_running_loop()
        return [t for t in loop._scheduled if not t.cancelled() and t.when() > loop.time() + 100]  # type: ignore[attr-defined]

    assert asyncio.run(fifty_requests()) == []
