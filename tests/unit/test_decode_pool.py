"""The decode pool (serve/model/decode_pool.py): work off the event loop, at most one piece a thread at once, results
and exceptions back to their callers, a cancelled caller's work never run."""

import asyncio
import threading
import time

import pytest

from serve.model.decode_pool import DecodePool


def test_every_caller_gets_its_own_result_or_exception():
    pool = DecodePool(2)

    def square(x):
        if x == 13:
            raise ValueError("unlucky")
        return x * x, threading.get_ident()

    async def go():
        return await asyncio.gather(*(pool.run(square, i) for i in range(40)), return_exceptions=True)

    results = asyncio.run(go())
    assert [r[0] for i, r in enumerate(results) if i != 13] == [i * i for i in range(40) if i != 13]
    assert isinstance(results[13], ValueError) and str(results[13]) == "unlucky"
    assert threading.get_ident() not in {r[1] for i, r in enumerate(results) if i != 13}  # never on the loop
    assert pool.in_progress == 0 and pool.seconds_each is not None


def test_no_more_pieces_run_at_once_than_threads():
    pool = DecodePool(3)
    running, most = 0, 0
    lock = threading.Lock()

    def hold():
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.02)
        with lock:
            running -= 1

    async def go():
        await asyncio.gather(*(pool.run(hold) for _ in range(12)))

    asyncio.run(go())
    assert most == 3


def test_work_whose_caller_left_while_it_waited_never_runs():
    pool = DecodePool(1)
    release, ran = threading.Event(), []

    async def go():
        first = asyncio.ensure_future(pool.run(release.wait))
        second = asyncio.ensure_future(pool.run(ran.append, "second"))
        await asyncio.sleep(0.05)  # the one thread holds the first; the second waits for it
        assert pool.backlogged()
        second.cancel()
        release.set()
        await first
        with pytest.raises(asyncio.CancelledError):
            await second
        await pool.run(ran.append, "third")  # the thread went on to later work

    asyncio.run(go())
    assert ran == ["third"] and pool.in_progress == 0


def test_inline_work_runs_on_the_event_loop():
    pool = DecodePool(1)

    async def go():
        return await pool.run(threading.get_ident, inline=True)

    assert asyncio.run(go()) == threading.get_ident()
