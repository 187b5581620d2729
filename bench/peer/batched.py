"""The batched peer: the image classifier BentoML's adaptive-batching guide leads a user to write.

`@bentoml.api(batchable=True)` on an async endpoint taking a list of images: BentoML's dispatcher merges
concurrent requests (each a list of one upload, field `image`) into one call. Preprocessing (contract/pil_transform.py)
and the ONNX Runtime session settings (serve/model/runtime.py) are the service's own, so what differs from ours is
the serving design only: here images are decoded inside the batched call, one after another, before the model
runs; ours decodes each request in its own thread before it joins a batch. Used by bench/serve_throughput.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import bentoml
import numpy as np
from PIL.Image import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from contract.manifest import read_manifest_unchecked  # noqa: E402
from contract.pil_transform import Preprocessor  # noqa: E402
from serve.model.runtime import onnx_providers, onnx_session_options  # noqa: E402

FOLDER = Path(os.environ["PEER_MODEL_DIR"])
DEVICE = os.environ.get("PEER_DEVICE", "cpu")


@bentoml.service(name="peer_batched")
class BatchedPeer:
    def __init__(self) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(
            str(FOLDER / "model.onnx"), onnx_session_options(), providers=onnx_providers(DEVICE)
        )
        self.pre = Preprocessor.from_manifest(read_manifest_unchecked(FOLDER)["preprocess"], max_pixels=10**8)

    @bentoml.api(route="/provider")
    def provider(self) -> dict:
        return {"provider": self.session.get_providers()[0]}

    def _predict(self, images: list[Image]) -> np.ndarray:
        batch = np.stack([self.pre(image.convert("RGB")) for image in images])
        return self.session.run(None, {"input": batch})[0]

    @bentoml.api(batchable=True, max_batch_size=32, max_latency_ms=10_000)  # ours' defaults (serve/config.py)
    async def classify(self, image: list[Image]) -> list[dict]:
        logits = await anyio.to_thread.run_sync(self._predict, image)  # off the event loop, like ours
        return [{"index": int(row.argmax())} for row in logits]
