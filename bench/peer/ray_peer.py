"""Ray Serve as a peer (bench/serve_throughput.py's side `peer_ray`): Ray Serve 2.60 (in its own virtualenv,
bench/peer/venvs.py) with a deployment batched by `@serve.batch`, as its batching guide writes one
(bench/peer/ray_app.py), sent the same protocol binary infers as ours_oip_tensor. Ray Serve speaks no inference
protocol of its own: the deployment parses and answers the protocol's binary form with handoff's own codec
(serve/oip_codec.py), so that what differs is the server, not the parsing."""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.peer.venvs import peer_python  # noqa: E402
from harness.server import BentoServer  # noqa: E402

PACKAGES = ("ray[serve]==2.60.0", "orjson")


class RayServeServer(BentoServer):
    def __init__(self, log: Path, export: Path) -> None:
        python = peer_python("ray", PACKAGES)
        app = ROOT / "bench" / "peer" / "ray_app.py"
        env = {"PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
        self._start(log, [str(python), str(app), str(export)], ROOT, env)

    def wait_ready(self, timeout: float = 300) -> float:
        self._wait("/v2/health/ready", timeout)
        return time.monotonic() - self.started
