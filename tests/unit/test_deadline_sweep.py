"""Deadlines checked by one timer a tick (serve/http/deadline_sweep.py): they expire as asyncio.timeout's do, a tick
late at most, and the deadlines met leave nothing behind."""

import asyncio
import time

import pytest

from serve.http.deadline_sweep import DeadlineSweep


def test_a_deadline_past_its_length_raises_timeout_error_in_place_within_a_tick():
    sweep = DeadlineSweep(0.3)

    async def stuck() -> tuple[float, bool]:
        started = time.monotonic()
        deadline = sweep.deadline()
        with pytest.raises(TimeoutError):
            async with deadline:
                await asyncio.sleep(30)
        return time.monotonic() - started, deadline.expired()

    waited, expired = asyncio.run(stuck())
    assert expired and 0.3 <= waited < 0.3 + sweep.tick_s + 0.2, waited
    assert sweep.due == {} and sweep.ticking is None  # the timer stops with nothing left to watch


def test_a_forgotten_deadline_never_expires_and_others_still_do():
    sweep = DeadlineSweep(0.2)

    async def two() -> list[str]:
        ended: list[str] = []

        async def watched(name: str, forget: bool) -> None:
            deadline = sweep.deadline()
            try:
                async with deadline:
                    if forget:
                        sweep.forget(deadline)  # as a response that has begun
                    await asyncio.sleep(0.5)
                ended.append(f"{name} finished")
            except TimeoutError:
                ended.append(f"{name} timed out")

        await asyncio.gather(watched("kept", False), watched("forgotten", True))
        return sorted(ended)

    assert asyncio.run(two()) == ["forgotten finished", "kept timed out"]


def test_many_deadlines_share_one_timer_and_met_ones_leave_nothing():
    sweep = DeadlineSweep(60)

    async def many() -> tuple[int, int, int]:
        loop = asyncio.get_running_loop()
        before = len(loop._scheduled)  # type: ignore[attr-defined]
        started = asyncio.Event()

        async def one() -> None:
            async with sweep.deadline():
                await started.wait()

        tasks = [asyncio.create_task(one()) for _ in range(200)]
        await asyncio.sleep(0)
        during = len(loop._scheduled) - before  # type: ignore[attr-defined]
        watched = len(sweep.due)
        started.set()
        await asyncio.gather(*tasks)
        return during, watched, len(sweep.due)

    during, watched, after = asyncio.run(many())
    assert (during, watched, after) == (1, 200, 0)


def test_an_error_of_the_body_passes_through_and_is_not_a_timeout():
    sweep = DeadlineSweep(5)

    async def fails() -> None:
        async with sweep.deadline():
            raise ValueError("the body's own")

    with pytest.raises(ValueError, match="the body's own"):
        asyncio.run(fails())
    assert sweep.due == {}


def test_a_sweep_serves_a_second_event_loop():
    sweep = DeadlineSweep(0.1)

    async def met() -> None:
        async with sweep.deadline():
            pass  # its loop closes before the tick it armed

    async def stuck() -> bool:
        deadline = sweep.deadline()
        with pytest.raises(TimeoutError):
            async with deadline:
                await asyncio.sleep(5)
        return deadline.expired()

    asyncio.run(met())
    assert sweep.ticking is not None  # armed on a loop that is gone
    assert asyncio.run(stuck()) and asyncio.run(stuck())


def test_keys_recorded_fall_due_in_turn_and_a_failing_expiry_stops_none_of_the_others():
    """A sweep of keys (serve/http/connections.py's header deadlines): `on_due` for each recorded and not forgotten,
    a key recorded again is due from then, and one whose expiry raises leaves the sweep running."""
    called: list[tuple[str, float]] = []

    def on_due(key: str) -> None:
        called.append((key, time.monotonic()))
        if key == "faulty":
            raise RuntimeError("an expiry's own fault")

    sweep = DeadlineSweep(0.2, on_due)

    async def watch() -> float:
        started = time.monotonic()
        for key in ("faulty", "idle", "met", "later"):
            sweep.record(key)
        sweep.forget("met")
        await asyncio.sleep(0.1)
        sweep.record("later")  # recorded again: due 0.2 s from now
        await asyncio.sleep(0.5)
        return started

    started = asyncio.run(watch())
    assert [key for key, _ in called] == ["faulty", "idle", "later"]
    at = dict(called)
    assert 0.2 <= at["idle"] - started < 0.2 + sweep.tick_s + 0.1 and at["later"] - started >= 0.3
    assert sweep.due == {} and sweep.ticking is None
