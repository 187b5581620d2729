"""The Ray Serve peer's app (bench/peer/ray_peer.py starts it in Ray's virtualenv): one replica whose requests are
batched by `@serve.batch` (max_batch_size 32 as the service's, Ray's default wait of 10 ms to fill a batch), each
batch one ONNX Runtime call with the service's session settings; the replica takes up to 128 requests at once, so
that batches can fill (Ray's default is 5).

    python bench/peer/ray_app.py EXPORT_DIR PORT
"""

from __future__ import annotations

import sys
import time

import numpy as np
import onnxruntime as ort
import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from serve.config import usable_cores
from serve.model.runtime import onnx_providers, onnx_session_options
from serve.protocols.oip_codec import OutputTensor, encode_infer_response, parse_infer_request


@serve.deployment(max_ongoing_requests=128, ray_actor_options={"num_cpus": 0})
class OnnxModel:
    def __init__(self, export: str) -> None:
        options = onnx_session_options(usable_cores())
        self.session = ort.InferenceSession(f"{export}/model.onnx", options, providers=onnx_providers("cpu"))
        self.input = self.session.get_inputs()[0].name
        self.outputs = [o.name for o in self.session.get_outputs()]

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01)
    async def run(self, rows: list[np.ndarray]) -> list[list[np.ndarray]]:
        sizes = [len(r) for r in rows]
        results = self.session.run(None, {self.input: np.concatenate(rows)})
        cuts = np.cumsum(sizes)[:-1]
        return [list(parts) for parts in zip(*(np.split(r, cuts) for r in results), strict=True)]

    async def __call__(self, request: Request) -> Response:
        if request.method == "GET":  # the readiness probe
            return Response(b'{"ready": true}', media_type="application/json")
        body = await request.body()
        parsed = parse_infer_request(body, request.headers.get("inference-header-content-length", "").encode() or None)
        values = await self.run(parsed.inputs[self.input].value)
        outputs = [OutputTensor(n, "FP32", v, True) for n, v in zip(self.outputs, values, strict=True)]
        content, headers = encode_infer_response("handoff", "1", parsed.id, outputs)
        return Response(content, headers={k.decode(): v.decode() for k, v in headers})


if __name__ == "__main__":
    export, port = sys.argv[1], int(sys.argv[2])
    ray.init(num_cpus=usable_cores(), include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(OnnxModel.bind(export), route_prefix="/")  # type: ignore[attr-defined]  # ray is not installed here
    while True:
        time.sleep(3600)
