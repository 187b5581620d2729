"""What an export's answers are compared with besides handoff's own model: the user's library, called on the
checkpoint's folder as a user of that folder calls it (sentence-transformers' `encode`, ...). The manifest's
`reference` records the library, its version and the call, or why handoff's own model had to stand in for it.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.tokenizer_spec import TextTokenizer
from export.pipeline import Check


@dataclass(frozen=True)
class Reference:
    """What the export's answers are compared with besides handoff's own model: the user's library on the folder."""

    library: str
    call: str
    checks: Callable[[TextTokenizer, Path], list[Check]] | None = None
    why_not: str | None = None  # why the library's call could not be the reference

    def to_manifest(self) -> dict[str, Any]:
        version = importlib.metadata.version(self.library) if self.checks is not None else None
        return {"library": self.library, "version": version, "call": self.call, "not_the_library": self.why_not}
