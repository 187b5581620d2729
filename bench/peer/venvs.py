"""A peer's own virtualenv (bench/.peers/NAME, gitignored), made and installed into the first time the peer is
measured: a server a user would pick instead of handoff brings its own web stack and pins, which must not change
the project's environment, and so the service under test. ONNX Runtime is installed at the project's locked version,
so that every side runs the same runtime."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from harness.server import BentoServer  # noqa: E402

PEERS = ROOT / "bench" / ".peers"


def locked(package: str) -> str:
    """`package==VERSION` as requirements/lock.txt pins it."""
    lock = (ROOT / "requirements" / "lock.txt").read_text()
    match = re.search(rf"^{re.escape(package)}==(\S+)$", lock, re.MULTILINE)
    if match is None:
        raise LookupError(f"{package} is not in requirements/lock.txt")
    return f"{package}=={match.group(1)}"


def peer_python(name: str, packages: tuple[str, ...]) -> Path:
    """The interpreter of the peer's virtualenv, with `packages` and the locked ONNX Runtime installed."""
    folder = PEERS / name
    python = folder / "bin" / "python"
    done = folder / "installed.txt"
    wanted = "\n".join([*packages, locked("onnxruntime-gpu")])
    if not done.is_file() or done.read_text() != wanted:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(folder)], check=True, timeout=300)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *wanted.split("\n")], check=True, timeout=1200)
        done.write_text(wanted)
    return python


class PeerApp(BentoServer):
    """A peer's app (bench/peer/APP) run by the interpreter of the peer's virtualenv, as
    `python APP EXPORT_DIR [ARGS...] PORT`, with the project on its path (the apps take the service's session
    settings from serve/model/runtime.py), ready when `ready_path` answers 200."""

    venv: ClassVar[str]
    packages: ClassVar[tuple[str, ...]]
    app: ClassVar[str]
    env: ClassVar[dict[str, str]] = {}

    def __init__(self, log: Path, export: Path, *args: str) -> None:
        python = peer_python(self.venv, self.packages)
        command = [str(python), str(ROOT / "bench" / "peer" / self.app), str(export), *args]
        self._start(log, command, ROOT, {"PYTHONPATH": str(ROOT), **self.env})
