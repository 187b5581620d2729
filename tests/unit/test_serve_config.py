"""The service's settings: each worker's share of the cores, and a bad value refused by name."""

import os

import pytest

from serve.config import ServeConfig, usable_cores


def test_workers_share_the_cores_and_an_explicit_thread_count_wins(monkeypatch):
    monkeypatch.delenv("HANDOFF_CPU_THREADS", raising=False)
    monkeypatch.setenv("HANDOFF_WORKERS", "1")
    assert ServeConfig().model_threads() == usable_cores()
    monkeypatch.setenv("HANDOFF_WORKERS", str(usable_cores() + 1))  # more workers than cores: one thread each
    assert ServeConfig().model_threads() == 1 and ServeConfig().cores_per_worker() == 1
    monkeypatch.setenv("HANDOFF_CPU_THREADS", "3")
    assert ServeConfig().model_threads() == 3


def test_a_thread_count_below_one_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("HANDOFF_CPU_THREADS", "0")
    with pytest.raises(ValueError, match="HANDOFF_CPU_THREADS=0: must be at least 1"):
        ServeConfig()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU sets are a Linux feature")
def test_usable_cores_follow_the_cpu_set():
    """A container limited to some cores (docker --cpuset-cpus) must not start a thread for each of the host's."""
    allowed = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(allowed)})
        assert usable_cores() == 1
    finally:
        os.sched_setaffinity(0, allowed)
