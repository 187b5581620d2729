"""GET /metrics in BentoML's multiprocess mode reads one file per worker: a file removed between the folder's
listing and its reading (another server clearing a shared BentoML home, a worker that ended) is listed again, not
answered with a 500 (schemathesis found it in CI)."""

from __future__ import annotations

import pytest
from prometheus_client import multiprocess

from serve.observability import request_metrics


def test_a_worker_file_removed_while_read_is_read_again(monkeypatch, tmp_path):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    calls = []

    def collect(self):
        calls.append(1)
        if len(calls) == 1:
            raise FileNotFoundError(tmp_path / "counter_123.db")
        return []

    monkeypatch.setattr(multiprocess.MultiProcessCollector, "collect", collect)
    assert request_metrics._exposition() == b""
    assert len(calls) == 2


def test_a_folder_that_keeps_changing_is_still_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))

    def collect(self):
        raise FileNotFoundError(tmp_path / "counter_123.db")

    monkeypatch.setattr(multiprocess.MultiProcessCollector, "collect", collect)
    with pytest.raises(FileNotFoundError):
        request_metrics._exposition()
