"""What handing one piece of work to a thread costs the server, on uvloop as the service runs: anyio's
`to_thread.run_sync` with a capacity limiter (what serve/service.py used) against asyncio's `run_in_executor`
on a pool of the same size (serve/decode_pool.py, what it uses now).

    python bench/handoff_cost.py [--calls 4000] [--concurrency 16] [--rounds 5]

The work is trivial (returns its argument), so the figure is the hand-off alone: the process's CPU time per
call, both sides of it (the loop and the threads), with --concurrency tasks handing work at once. The two ways
alternate round by round; the ratio is the median of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import anyio.to_thread
import uvloop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.results import write_result  # noqa: E402
from serve.decode_pool import DecodePool  # noqa: E402

THREADS = 2


def identity(value: int) -> int:
    return value


async def cpu_per_call(hand_off: Callable[[], Awaitable[int]], calls: int, concurrency: int) -> float:
    async def client() -> None:
        for _ in range(calls // concurrency):
            await hand_off()

    started = time.process_time()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return (time.process_time() - started) / calls


async def rounds(calls: int, concurrency: int, count: int) -> dict[str, list[float]]:
    limiter, pool = anyio.CapacityLimiter(THREADS), DecodePool(THREADS)
    ways: dict[str, Callable[[], Awaitable[int]]] = {
        "anyio to_thread.run_sync with a limiter": lambda: anyio.to_thread.run_sync(identity, 1, limiter=limiter),
        "run_in_executor (serve/decode_pool.py)": lambda: pool.run(identity, 1),
    }
    for hand_off in ways.values():  # warm both: threads started, code paths taken
        await cpu_per_call(hand_off, 200, concurrency)
    figures: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(count):
        for name in list(ways)[:: 1 if round_ % 2 == 0 else -1]:
            figures[name].append(await cpu_per_call(ways[name], calls, concurrency))
    return figures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=4000, help="hand-offs per side per round")
    p.add_argument("--concurrency", type=int, default=16, help="tasks handing work at once")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    figures = uvloop.run(rounds(args.calls, args.concurrency, args.rounds))
    anyio_way, pool_way = figures.values()
    ratio = statistics.median(a / b for a, b in zip(anyio_way, pool_way, strict=True))
    for name, values in figures.items():
        print(f"{name}: {1e6 * statistics.median(values):.1f} us of CPU per call (median of {args.rounds} rounds)")
    print(f"anyio / run_in_executor: {ratio:.2f} x (median of the rounds' ratios)")
    path = write_result(
        "handoff_cost_cpu",
        {
            "rounds": args.rounds,
            "workload": f"a trivial function handed to {THREADS} threads, {args.concurrency} tasks at once, uvloop",
            "figures": {
                f"{name}, CPU per call (median of {args.rounds} rounds)": f"{1e6 * statistics.median(v):.1f} us"
                for name, v in figures.items()
            },
            "ratios": {"anyio over run_in_executor, CPU per call": ratio},
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
