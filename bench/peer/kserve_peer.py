"""KServe as a peer (bench/serve_throughput.py's side `peer_kserve`): KServe's own model server (`kserve`
0.21 from PyPI, in its own virtualenv, bench/peer/venvs.py) serving a `kserve.Model` as its docs write one
(bench/peer/kserve_app.py), on the Open Inference Protocol (v2) REST endpoints, sent the same binary infers as
ours_oip_tensor. KServe's model server has no batching of its own (its docs send users to the
InferenceService's batcher sidecar, which a single host does not run): each request is one model call."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.peer.venvs import PeerApp  # noqa: E402


class KServeServer(PeerApp):
    venv, packages, app = "kserve", ("kserve==0.21.0",), "kserve_app.py"
    ready_path = "/v2/health/ready"
