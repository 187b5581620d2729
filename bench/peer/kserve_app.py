"""The KServe peer's server (bench/peer/kserve_peer.py starts it in KServe's virtualenv): a `kserve.Model` whose
`predict` takes the protocol's infer request and runs it as one ONNX Runtime call, with the service's session
settings, answering the outputs as binary data as the request's client asks.

    python bench/peer/kserve_app.py EXPORT_DIR PORT
"""

from __future__ import annotations

import sys

import kserve
import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse

from serve.config import usable_cores
from serve.model.runtime import onnx_providers, onnx_session_options

NAME = "handoff"  # the same path as the service's protocol: /v2/models/handoff/infer


class OnnxModel(kserve.Model):
    def __init__(self, export: str) -> None:
        super().__init__(NAME)
        options = onnx_session_options(usable_cores())
        self.session = ort.InferenceSession(f"{export}/model.onnx", options, providers=onnx_providers("cpu"))
        self.ready = True

    async def predict(self, payload: InferRequest, headers: dict | None = None, response_headers: dict | None = None):
        feed = {tensor.name: tensor.as_numpy() for tensor in payload.inputs}
        names = [output.name for output in self.session.get_outputs()]
        outputs = []
        for name, value in zip(names, self.session.run(None, feed), strict=True):
            output = InferOutput(name=name, shape=list(value.shape), datatype="FP32")
            output.set_data_from_numpy(value, binary_data=True)
            outputs.append(output)
        return InferResponse(response_id=payload.id, model_name=NAME, infer_outputs=outputs, use_binary_outputs=True)


if __name__ == "__main__":
    export, port = sys.argv[1], int(sys.argv[2])
    kserve.ModelServer(http_port=port, grpc_port=port + 1, enable_grpc=False, workers=1).start([OnnxModel(export)])
