"""The Triton peer's model (bench/peer/triton_peer.py copies it into the repository as `1/model.py`): Triton's
Python backend calls `execute` with every request of a dynamic batch at once; they run as one ONNX Runtime call,
with the service's session settings, and each request gets its own rows back.

Where the repository's input is `image` (BYTES: encoded files, as handoff's protocol takes them), each file is
first decoded and preprocessed by the service's own Preprocessor (the fast JPEG decode where the export's check
passed, as the service's default), on a thread per core as a user would to use the cores (PIL lets the GIL go
while it decodes)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils  # provided by Triton's Python backend

from contract.manifest import fast_decode_passed, read_manifest_unchecked
from contract.pil_transform import Preprocessor
from serve.model.runtime import onnx_providers, onnx_session_options

IMAGE_INPUT = "image"


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        parameters = {k: v["string_value"] for k, v in config["parameters"].items()}
        threads = int(parameters["threads"])
        model = f"{parameters['export']}/model.onnx"
        self.session = ort.InferenceSession(model, onnx_session_options(threads), providers=onnx_providers("cpu"))
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.images = [i["name"] for i in config["input"]] == [IMAGE_INPUT]
        if self.images:
            manifest = read_manifest_unchecked(parameters["export"])
            self.preprocess = Preprocessor.from_manifest(manifest["preprocess"], max_pixels=40_000_000)
            self.fast = fast_decode_passed(manifest)
            self.decoders = ThreadPoolExecutor(threads)

    def _prepare(self, data: bytes) -> np.ndarray:
        return self.preprocess(self.preprocess.decode(data, fast=self.fast))

    def _decoded(self, requests: list) -> list[dict[str, np.ndarray]]:
        """Every request's files decoded at once, across the batch's requests, then each request's rows."""
        files = [pb_utils.get_input_tensor_by_name(r, IMAGE_INPUT).as_numpy().reshape(-1) for r in requests]
        pixels = list(self.decoders.map(self._prepare, [bytes(f) for each in files for f in each]))
        (name,) = self.inputs
        parts, start = [], 0
        for each in files:
            parts.append({name: np.stack(pixels[start : start + len(each)])})
            start += len(each)
        return parts

    def execute(self, requests: list) -> list:
        if self.images:
            parts = self._decoded(requests)
        else:
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
