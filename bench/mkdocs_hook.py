"""MkDocs hook (mkdocs.yml `hooks:`): adds reference/benchmark-results.md, rendered from bench/results by
bench/report.py when the site is built, so the page always shows the stored results and is never committed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.report import render  # noqa: E402

PAGE = "reference/benchmark-results.md"


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files
