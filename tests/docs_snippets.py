"""The docs' code blocks, for the tests that run them as written (docs/testing.md lists which are run)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def code_blocks(page: str, language: str) -> list[str]:
    """The ```language blocks of docs/PAGE, in order."""
    return re.findall(rf"```{language}\n(.*?)```", (ROOT / "docs" / page).read_text(), re.S)


def _localised(text: str, url: str, replace: dict[str, str]) -> str:
    """`text` pointed at the service at `url` instead of localhost:3000, with `replace`'s substitutions."""
    text = text.replace("http://localhost:3000", url).replace("localhost:3000", url.removeprefix("http://"))
    for old, new in replace.items():
        text = text.replace(old, new)
    return text


def run_curl_lines(page: str, url: str, replace: dict[str, str]) -> list[str]:
    """Runs every complete `curl` line of the page's bash blocks (lines holding `...` are sketches) against
    `url`; returns each answer."""
    answers = []
    for block in code_blocks(page, "bash"):
        for line in block.splitlines():
            command = line.split("  #")[0].strip()
            if not command.startswith("curl ") or "..." in command:
                continue
            args = shlex.split(_localised(command, url, replace))
            result = subprocess.run(["curl", "-sS", "--fail-with-body", *args[1:]], capture_output=True, timeout=60)
            assert result.returncode == 0, f"{line}: {result.stderr.decode()} {result.stdout[:300]!r}"
            answers.append(result.stdout.decode())
    assert answers, f"no runnable curl line in docs/{page}"
    return answers


def run_python_block(page: str, marker: str, url: str, replace: dict[str, str]) -> dict:
    """Executes the page's python block that contains `marker` against `url`; returns its namespace."""
    block = next(b for b in code_blocks(page, "python") if marker in b)
    namespace: dict = {}
    exec(_localised(block, url, replace), namespace)  # noqa: S102 - our own docs
    return namespace
