"""MLServer as a peer (bench/serve_throughput.py's side `peer_mlserver`): Seldon's MLServer 1.7 (in its own
virtualenv, bench/peer/venvs.py; uvloop held below 0.22, which it needs) serving a custom `MLModel`
(bench/peer/mlserver_app.py) with its adaptive batching on (`max_batch_size` 32 as the service's, `max_batch_time`
10 ms) and its default of one parallel inference worker. MLServer's REST endpoint takes the protocol's JSON form
only, so this side and `ours_oip_json` are sent the same JSON infers of the same FP32 tensors."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.peer.venvs import peer_python  # noqa: E402
from harness.server import BentoServer  # noqa: E402

PACKAGES = ("mlserver==1.7.1", "uvloop<0.22")


class MLServerServer(BentoServer):
    def __init__(self, log: Path, export: Path) -> None:
        python = peer_python("mlserver", PACKAGES)
        folder = tempfile.mkdtemp(prefix="mlserver-")
        app = ROOT / "bench" / "peer" / "mlserver_app.py"
        env = {"PYTHONPATH": f"{ROOT / 'bench' / 'peer'}:{ROOT}"}
        self._start(log, [str(python), str(app), folder, str(export)], ROOT, env)

    def wait_ready(self, timeout: float = 300) -> float:
        self._wait("/v2/models/handoff/ready", timeout)
        return time.monotonic() - self.started
