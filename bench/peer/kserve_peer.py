"""KServe as a peer (bench/serve_throughput.py's side `peer_kserve`): KServe's own model server (`kserve`
0.21 from PyPI, in its own virtualenv, bench/peer/venvs.py) serving a `kserve.Model` as its docs write one
(bench/peer/kserve_app.py), on the Open Inference Protocol (v2) REST endpoints, sent the same binary infers as
ours_oip_tensor. KServe's model server has no batching of its own (its docs send users to the
InferenceService's batcher sidecar, which a single host does not run): each request is one model call."""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.peer.venvs import peer_python  # noqa: E402
from harness.server import BentoServer  # noqa: E402

PACKAGES = ("kserve==0.21.0",)


class KServeServer(BentoServer):
    def __init__(self, log: Path, export: Path) -> None:
        python = peer_python("kserve", PACKAGES)
        app = ROOT / "bench" / "peer" / "kserve_app.py"
        self._start(log, [str(python), str(app), str(export)], ROOT, {"PYTHONPATH": str(ROOT)})

    def wait_ready(self, timeout: float = 180) -> float:
        self._wait("/v2/health/ready", timeout)
        return time.monotonic() - self.started
