"""Ray Serve as a peer (bench/serve_throughput.py's side `peer_ray`): Ray Serve 2.60 (in its own virtualenv,
bench/peer/venvs.py) with a deployment batched by `@serve.batch`, as its batching guide writes one
(bench/peer/ray_app.py), sent the same protocol binary infers as ours_oip_tensor. Ray Serve speaks no inference
protocol of its own: the deployment parses and answers the protocol's binary form with handoff's own codec
(serve/protocols/oip_codec.py), so that what differs is the server, not the parsing."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.peer.venvs import PeerApp  # noqa: E402


class RayServeServer(PeerApp):
    venv, packages, app = "ray", ("ray[serve]==2.60.0", "orjson"), "ray_app.py"
    env = {"RAY_USAGE_STATS_ENABLED": "0"}
    ready_path = "/v2/health/ready"
