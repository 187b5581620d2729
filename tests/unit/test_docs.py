"""The docs and the command line agree: every flag `--help` prints has a row in its page's flags table, and
every flag a table names exists. A flag added without its documentation fails here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = {
    "train.md": [sys.executable, "train/main.py", "--help"],
    "export.md": [sys.executable, "-m", "export", "--help"],
}


def help_flags(command: list[str]) -> set[str]:
    text = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True, timeout=120).stdout
    # option lines start with the flag (the usage line and the examples below it name others, torchrun's too)
    return set(re.findall(r"^\s+(--[a-z][a-z0-9-]*)", text, re.MULTILINE)) - {"--help"}


def table_flags(page: str) -> set[str]:
    """The flags named in the first column of the page's `## Flags` table."""
    section = (ROOT / "docs" / page).read_text().split("## Flags", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {flag for row in rows for flag in re.findall(r"--[a-z][a-z0-9-]*", row.split("|")[1])}


@pytest.mark.parametrize("page", sorted(COMMANDS))
def test_the_flags_table_matches_help(page: str):
    documented, actual = table_flags(page), help_flags(COMMANDS[page])
    assert not actual - documented, f"docs/{page} lacks a row for {sorted(actual - documented)}"
    assert not documented - actual, f"docs/{page} names flags --help does not have: {sorted(documented - actual)}"
