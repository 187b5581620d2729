"""The LitServe peer's app (bench/peer/litserve_peer.py starts it): LitServe with its batching on, as its docs
show (`LitAPI(max_batch_size=..., batch_timeout=...)` with `batch`/`unbatch`), the same decoding
(contract/pil_transform.py) and ONNX Runtime session settings as the service.

    PEER_MODEL_DIR=DIR PEER_DEVICE=cpu python bench/peer/litserve_app.py PORT   (litserve on PYTHONPATH)

POST /classify takes the JPEG as the multipart field `image` and answers {"index": top-1}; GET /readyz
(LitServe's health check, renamed) answers 200 once its inference worker is set up; POST /provider names ONNX
Runtime's provider. The class is at module level because LitServe's inference worker is a spawned process
that unpickles it; the model folder and device come from the environment for the same reason.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import litserve as ls
import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from contract.manifest import fast_decode_passed, read_manifest_unchecked  # noqa: E402
from contract.pil_transform import Preprocessor  # noqa: E402
from serve.model.runtime import onnx_providers, onnx_session_options  # noqa: E402

FOLDER = Path(os.environ.get("PEER_MODEL_DIR", "."))
DEVICE = os.environ.get("PEER_DEVICE", "cpu")
MAX_BATCH_SIZE = 32  # as the service's default
BATCH_TIMEOUT_S = 0.01  # how long LitServe waits to fill a batch


class ClassifierAPI(ls.LitAPI):
    def setup(self, device: str) -> None:
        options, providers = onnx_session_options(), onnx_providers(DEVICE)
        self.session = ort.InferenceSession(str(FOLDER / "model.onnx"), options, providers=providers)
        manifest = read_manifest_unchecked(FOLDER)
        self.preprocess = Preprocessor.from_manifest(manifest["preprocess"], max_pixels=10**8)
        self.fast_decode = fast_decode_passed(manifest)  # decoding as the service does by default

    def decode_request(self, request):  # unannotated: LitServe then hands it the parsed form
        return self.preprocess(self.preprocess.decode(request["image"].file.read(), fast=self.fast_decode))

    def batch(self, rows: list[np.ndarray]) -> np.ndarray:
        return np.stack(rows)

    def predict(self, batch: np.ndarray) -> np.ndarray:
        return self.session.run(None, {"input": batch})[0]

    def unbatch(self, logits: np.ndarray) -> list[np.ndarray]:
        return list(logits)

    def encode_response(self, logits: np.ndarray) -> dict[str, int]:
        return {"index": int(logits.argmax())}


if __name__ == "__main__":
    api = ClassifierAPI(max_batch_size=MAX_BATCH_SIZE, batch_timeout=BATCH_TIMEOUT_S, api_path="/classify")
    server = ls.LitServer(api, accelerator=DEVICE, devices=1, healthcheck_path="/readyz")
    probe = ort.InferenceSession(str(FOLDER / "model.onnx"), providers=onnx_providers(DEVICE))

    @server.app.post("/provider")
    async def provider() -> dict[str, str]:  # a session made as the worker makes its own
        return {"provider": probe.get_providers()[0]}

    server.run(port=int(sys.argv[1]), log_level="warning", generate_client_file=False)
