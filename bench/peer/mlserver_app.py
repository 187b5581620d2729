"""The MLServer peer (bench/peer/mlserver_peer.py starts it in MLServer's virtualenv): `OnnxModel` is the custom
runtime MLServer's docs have one write (`MLModel.load`, `predict` on a decoded batch), on the service's ONNX Runtime
session settings. Run as a script it writes MLServer's settings (the port given) and the model's (adaptive batching
on) into FOLDER, and hands over to `mlserver start FOLDER`.

    python bench/peer/mlserver_app.py EXPORT_DIR FOLDER PORT
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

from serve.config import usable_cores
from serve.model.runtime import onnx_providers, onnx_session_options


class OnnxModel(MLModel):
    async def load(self) -> bool:
        options = onnx_session_options(usable_cores())
        model = f"{self.settings.parameters.uri}/model.onnx"
        self.session = ort.InferenceSession(model, options, providers=onnx_providers("cpu"))
        self.input_name = self.session.get_inputs()[0].name
        self.output_names = [o.name for o in self.session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        batch = NumpyCodec.decode_input(payload.inputs[0])
        values = self.session.run(None, {self.input_name: batch})
        outputs = [NumpyCodec.encode_output(name, value) for name, value in zip(self.output_names, values, strict=True)]
        return InferenceResponse(model_name=self.name, outputs=outputs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    export, folder, port = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    settings: dict[str, object] = {
        "http_port": port,
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "parallel_workers": 1,
        "metrics_dir": str(folder / "metrics"),  # by default .metrics in the working directory: the checkout
    }
    (folder / "settings.json").write_text(json.dumps(settings))
    model = {
        "name": "handoff",
        "implementation": "mlserver_app.OnnxModel",
        "max_batch_size": 32,
        "max_batch_time": 0.01,
        "parameters": {"uri": export},
    }
    (folder / "model-settings.json").write_text(json.dumps(model))
    mlserver = str(Path(sys.executable).parent / "mlserver")
    os.execv(mlserver, [mlserver, "start", str(folder)])
