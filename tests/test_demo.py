"""`make demo` as the README gives it, in a network namespace of its own with only the loopback up: the promise
that nothing is downloaded at run time (no weights, no datasets, no packages) holds only if the whole job runs
where nothing can be."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

IMAGES = 200  # what `make demo` classifies over HTTP (its last step, scripts/demo_serve.py)


def test_make_demo_runs_with_no_network(tmp_path: Path):
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("ip")):
        pytest.skip("needs root, unshare and ip to run the demo in a network namespace of its own")
    # The namespace holds only `lo`, brought up for torchrun's rendezvous and the HTTP the demo speaks to itself;
    # the first line proves that no other link exists, so any download would fail the job.
    script = (
        f'test -z "$(ip -o link show | grep -v ": lo:")" && ip link set lo up && exec make demo RUN={tmp_path}/demo'
    )
    done = subprocess.run(
        ["unshare", "--net", "sh", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    output = done.stdout + done.stderr
    print(output[-1500:])
    assert done.returncode == 0, output[-4000:]
    served = re.search(r"(\d+) digits over HTTP: .*top-1 agreement (\d+)/(\d+)", done.stdout)
    assert served and int(served.group(1)) == int(served.group(2)) == IMAGES, done.stdout[-2000:]
