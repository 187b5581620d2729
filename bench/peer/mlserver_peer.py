"""MLServer as a peer (bench/serve_throughput.py's side `peer_mlserver`): Seldon's MLServer 1.7 (in its own
virtualenv, bench/peer/venvs.py; uvloop held below 0.22, which it needs) serving a custom `MLModel`
(bench/peer/mlserver_app.py) with its adaptive batching on (`max_batch_size` 32 as the service's, `max_batch_time`
10 ms) and its default of one parallel inference worker. MLServer's REST endpoint takes the protocol's JSON form
only, so this side and `ours_oip_json` are sent the same JSON infers of the same FP32 tensors."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.peer.venvs import PeerApp  # noqa: E402


class MLServerServer(PeerApp):
    venv, packages, app = "mlserver", ("mlserver==1.7.1", "uvloop<0.22"), "mlserver_app.py"
    env = {"PYTHONPATH": f"{ROOT / 'bench' / 'peer'}:{ROOT}"}  # MLServer imports the model by module name
    ready_path = "/v2/models/handoff/ready"

    def __init__(self, log: Path, export: Path) -> None:
        self.settings = Path(tempfile.mkdtemp(prefix="mlserver-"))  # MLServer's settings, written by the app
        super().__init__(log, export, str(self.settings))

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.settings, ignore_errors=True)
