"""`pip install .` beside a torch the environment already holds installs no other torch (nor anything else it
has): pyproject.toml takes ranges, not the lock's pins."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT


def test_installing_beside_an_existing_stack_replaces_nothing(tmp_path):
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    planned = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert planned == ["handoff"], f"pip would also install {planned}"
