"""The text peer: the sentence classifier BentoML's adaptive-batching guide leads a user to write.

`@bentoml.api(batchable=True)` on an async endpoint taking a list of texts: BentoML's dispatcher merges
concurrent requests (each `{"texts": ["..."]}`) into one call, which tokenizes the batch and runs the model.
The tokenizer (contract/tokenizer_spec.py: the exported tokenizer.json, truncation, padding to the longest) and the
ONNX Runtime session settings (serve/model/runtime.py) are the service's own, so what differs from ours is the serving
design only. Used by bench/text_serving.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import bentoml
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from contract.manifest import read_manifest_unchecked  # noqa: E402
from contract.tokenizer_spec import TextTokenizer, TokenizerSettings  # noqa: E402
from serve.model.runtime import onnx_providers, onnx_session_options  # noqa: E402

FOLDER = Path(os.environ["PEER_MODEL_DIR"])
DEVICE = os.environ.get("PEER_DEVICE", "cpu")


@bentoml.service(name="peer_text_batched")
class TextBatchedPeer:
    def __init__(self) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(
            str(FOLDER / "model.onnx"), onnx_session_options(), providers=onnx_providers(DEVICE)
        )
        settings = TokenizerSettings.from_manifest(read_manifest_unchecked(FOLDER)["tokenizer"])
        self.tokenizer = TextTokenizer((FOLDER / settings.file).read_bytes(), settings)

    @bentoml.api(route="/provider")
    def provider(self) -> dict:
        return {"provider": self.session.get_providers()[0]}

    def _predict(self, texts: list[str]) -> np.ndarray:
        return self.session.run(["logits"], self.tokenizer.encode(texts).rows)[0]

    @bentoml.api(batchable=True, max_batch_size=32, max_latency_ms=10_000)  # ours' defaults (serve/config.py)
    async def classify(self, texts: list[str]) -> list[dict]:
        logits = await anyio.to_thread.run_sync(self._predict, texts)  # off the event loop, like ours
        return [{"index": int(row.argmax())} for row in logits]
