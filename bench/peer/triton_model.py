"""The Triton peer's model (bench/peer/triton_peer.py copies it into the repository as `1/model.py`): Triton's
Python backend calls `execute` with every request of a dynamic batch at once; they run as one ONNX Runtime call,
with the service's session settings, and each request gets its own rows back."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils  # provided by Triton's Python backend

from serve.runtime import onnx_providers, onnx_session_options


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        parameters = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        options = onnx_session_options(int(parameters["threads"]))
        model = f"{parameters['export']}/model.onnx"
        self.session = ort.InferenceSession(model, options, providers=onnx_providers("cpu"))
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]

    def execute(self, requests: list) -> list:
        parts = [{n: pb_utils.get_input_tensor_by_name(r, n).as_numpy() for n in self.inputs} for r in requests]
        joined = {name: np.concatenate([p[name] for p in parts]) for name in self.inputs}
        results = dict(zip(self.outputs, self.session.run(None, joined), strict=True))
        responses, start = [], 0
        for part in parts:
            rows = len(part[self.inputs[0]])
            tensors = [pb_utils.Tensor(name, results[name][start : start + rows]) for name in self.outputs]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            start += rows
        return responses
