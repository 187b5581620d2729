"""The serving benchmarks' throughput (bench/load.py, steady_rate): the slope of answers against time, which a
batching server's waves of answers and the window's edges do not move the way they move a plain count; and the
server's CPU by process and thread."""

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/ is scripts, not an installed package
from bench.load import RAMP_S, steady_rate, thread_cpu_seconds  # noqa: E402
from bench.results import side_order  # noqa: E402

BATCH, PERIOD, SPACING = 32, 0.68, 0.0013  # a batch of 32 answered every 0.68 s, one answer per 1.3 ms
TRUE_RATE = BATCH / PERIOD


def waves(first: float, end: float) -> list[float]:
    """Answer times of a server answering a batch at a time, the first batch at `first`, cut at `end`."""
    starts = np.arange(first, end, PERIOD)
    times = (starts[:, None] + SPACING * np.arange(BATCH)[None, :]).ravel()
    return sorted(float(t) for t in times if t < end)


def test_the_slope_holds_wherever_the_window_cuts_the_waves():
    whole_window_errors = []
    for first in np.linspace(0.8, 0.8 + PERIOD, 12, endpoint=False):  # the pipeline fills before the first wave
        answers = waves(first, end=8.0)
        assert abs(steady_rate(answers, started=0.0) / TRUE_RATE - 1) < 0.01
        whole_window_errors.append(abs(len(answers) / 8.0 / TRUE_RATE - 1))
    assert max(whole_window_errors) > 0.05  # what a count over the window would have reported


def test_answers_in_the_ramp_do_not_count():
    steady = waves(RAMP_S + 0.1, end=8.0)
    burst = list(np.linspace(0.0, RAMP_S * 0.9, 200))  # e.g. the warm-up's backlog answered at once
    assert abs(steady_rate(burst + steady, started=0.0) / steady_rate(steady, started=0.0) - 1) < 1e-9


def test_no_rate_without_two_answers_after_the_ramp():
    assert steady_rate([], started=0.0) == 0.0
    assert steady_rate([0.1, 0.2, RAMP_S + 1], started=0.0) == 0.0


def test_no_side_always_follows_the_same_one():
    """bench/results.side_order: each round measures every side once, and over rounds each side follows
    more than one other (a plain rotation kept one predecessor for each, and an order effect with it)."""
    sides = ["peer_floor", "peer_litserve", "ours", "ours_raw_body"]
    predecessors: dict[str, set[str]] = {side: set() for side in sides}
    for round_ in range(4):
        order = side_order(sides, round_)
        assert sorted(order) == sorted(sides)
        for before, after in zip(order, order[1:]):
            predecessors[after].add(before)
    assert all(len(names) >= 2 for names in predecessors.values()), predecessors


def test_each_of_two_sides_goes_first_in_half_the_rounds():
    """An A/B (a change against its baseline) must not measure the same side first in every round."""
    firsts = [side_order(["ours", "at_before"], round_)[0] for round_ in range(4)]
    assert sorted(firsts) == ["at_before", "at_before", "ours", "ours"], firsts


def test_a_servers_cpu_is_told_apart_by_process_and_thread(tmp_path):
    """A real process whose second thread spins while its main thread sleeps, and a child of it that sleeps (a
    thread's CPU is read while it lives, as a server's threads do)."""
    script = tmp_path / "spinner.py"
    script.write_text(
        "import subprocess, sys, threading, time\n"
        "child = subprocess.Popen([sys.executable, '-m', 'timeit', '-n1', '-r1', 'import time; time.sleep(30)'])\n"
        "def spin():\n"
        "    while True: pass\n"
        "threading.Thread(target=spin, daemon=True).start()\n"
        "print('started', flush=True)\n"
        "time.sleep(30)\n"
    )
    server = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "started"
        time.sleep(1.0)
        seconds = thread_cpu_seconds(server.pid)
    finally:
        for process in psutil.Process(server.pid).children():
            process.kill()
        server.kill()
        server.wait()
    assert set(seconds) == {
        f"{role}: {part}" for role in ("spinner.py", "timeit") for part in ("main thread", "other threads")
    }
    assert seconds["spinner.py: other threads"] >= 0.3 > seconds["spinner.py: main thread"]
    assert seconds["timeit: main thread"] < 0.3 and seconds["timeit: other threads"] == 0
