"""LitServe as a peer (bench/serve_throughput.py's side `peer_litserve`): bench/peer/litserve_app.py started as
a process. LitServe is not a dependency of handoff (it brings its own FastAPI), so the pinned versions below are
installed with `--no-deps` into bench/.litserve (gitignored) the first time, and that folder is put on the peer's
PYTHONPATH only, leaving the project's environment, and so the service under test, as it is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from harness.server import ScriptServer  # noqa: E402

# fastapi 0.165 accepts the project's starlette 1.x; the rest LitServe needs is in the project's environment
PACKAGES = ("litserve==0.2.19", "fastapi==0.165.0", "annotated-doc", "typing-inspection")
TARGET = ROOT / "bench" / ".litserve"


def install_litserve() -> Path:
    if not (TARGET / "litserve").is_dir():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(TARGET), *PACKAGES],
            check=True,
            timeout=600,
        )
    return TARGET


def litserve_server(log: Path, folder: Path, device: str) -> ScriptServer:
    """The LitServe peer started as a process, with the interface the benchmarks use for BentoML servers."""
    pythonpath = os.pathsep.join(filter(None, [str(install_litserve()), os.environ.get("PYTHONPATH")]))
    app = ROOT / "bench" / "peer" / "litserve_app.py"
    return ScriptServer(log, app, PEER_MODEL_DIR=str(folder), PEER_DEVICE=device, PYTHONPATH=pythonpath)
