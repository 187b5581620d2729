"""The service's settings: each worker's share of the cores, and a bad value refused by name."""

import os
import re
from pathlib import Path

import pytest

from serve.config import SETTINGS, ServeConfig, cpu_quota, usable_cores

SERVE_DOCS = Path(__file__).resolve().parents[2] / "docs" / "serve.md"


def test_the_docs_settings_table_lists_every_setting_and_no_other():
    rows = re.findall(r"^\| `(HANDOFF_[A-Z0-9_]+)` \|", SERVE_DOCS.read_text(), re.MULTILINE)
    assert sorted(rows) == sorted(SETTINGS)


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


@pytest.mark.parametrize("value", ["0", "-1"])
def test_lanes_below_one_are_refused_by_name_and_auto_is_the_default(monkeypatch, value):
    monkeypatch.setenv("HANDOFF_LANES", value)
    with pytest.raises(ValueError, match=f"HANDOFF_LANES={value}: must be at least 1"):
        ServeConfig()
    monkeypatch.setenv("HANDOFF_LANES", "auto")
    assert ServeConfig().lanes is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU sets are a Linux feature")
def test_usable_cores_follow_the_cpu_set():
    """A container limited to some cores (docker --cpuset-cpus) must not start a thread for each of the host's."""
    allowed = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(allowed)})
        assert usable_cores() == 1
    finally:
        os.sched_setaffinity(0, allowed)


@pytest.mark.parametrize(
    "files, expected",
    [
        ({"cpu.max": "150000 100000\n"}, 1.5),  # cgroup v2: docker --cpus 1.5
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2.0),  # cgroup v1
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({"cpu.max": "garbage\n"}, None),
        ({}, None),
    ],
)
def test_the_cpu_quota_is_read_from_either_cgroup_version(tmp_path, files, expected):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cpu_quota(tmp_path) == expected


def test_a_cpu_quota_caps_the_cores_rounded_up(tmp_path):
    (tmp_path / "cpu.max").write_text("50000 100000\n")  # half a core: one thread, not zero
    assert usable_cores(tmp_path) == 1
    (tmp_path / "cpu.max").write_text(f"{100000 * (usable_cores() + 8)} 100000\n")  # a quota above the CPU set
    assert usable_cores(tmp_path) == usable_cores()


@pytest.mark.parametrize("value", ["", "  ", " , ,"])
def test_api_keys_set_but_empty_are_refused_not_read_as_no_gate(monkeypatch, value):
    """Security round 3, item 9: an empty or blank HANDOFF_API_KEYS turned the key gate off without a word."""
    monkeypatch.setenv("HANDOFF_API_KEYS", value)
    with pytest.raises(ValueError, match="HANDOFF_API_KEYS is set but holds no key"):
        ServeConfig()
    monkeypatch.setenv("HANDOFF_API_KEYS", " a, b ")
    assert ServeConfig().api_keys == ("a", "b")
