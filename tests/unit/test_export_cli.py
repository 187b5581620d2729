"""`python -m export`'s command line answers a usage error before it imports torch (~7 s of CPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Runs main() in a fresh interpreter and reports whether torch was imported by the time it returned.
PROBE = (
    "import sys; from export.__main__ import main; status = main(sys.argv[1:]); print(status, 'torch' in sys.modules)"
)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--formats", "tflite"], "--formats='tflite': choose from"),
        (["--image-size", "0"], "--image-size=0"),
        (["--atol", "-1"], "--atol=-1"),
        (["--int8", "--fp16"], "choose one precision"),
        (["--labels", "/dev/zero"], "no such file"),
    ],
)
def test_usage_errors_are_answered_before_torch_is_imported(args: list[str], needle: str):
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "weights.pth", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr
    assert done.stderr.startswith("export: error: ") and needle in done.stderr, done.stderr


def test_good_options_go_on_to_the_export(tmp_path: Path):
    """The same probe with options that pass: the export runs (and imports torch) and fails on the missing file."""
    missing = tmp_path / "missing.pth"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(missing), "--no-bento"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.split()[-2:] == ["2", "True"], done.stdout + done.stderr
    assert "export: error:" in done.stderr and "missing.pth" in done.stderr, done.stderr
