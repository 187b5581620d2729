"""The peer: a plain BentoML image classifier written the way the common examples write it.

One request, one model call; the image decoded by BentoML into a PIL image inside the API; no batching.
Used only by bench/serve_throughput.py, as the baseline our service is compared with.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import bentoml
import numpy as np
from PIL.Image import Image

FOLDER = Path(os.environ["PEER_MODEL_DIR"])


@bentoml.service(name="peer")
class PeerClassifier:
    def __init__(self) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(FOLDER / "model.onnx"), providers=["CPUExecutionProvider"])
        pre = json.loads((FOLDER / "manifest.json").read_text())["preprocess"]
        self.resize, self.crop = pre["resize"], pre["crop"]
        self.mean = np.array(pre["mean"], dtype=np.float32).reshape(3, 1, 1)
        self.std = np.array(pre["std"], dtype=np.float32).reshape(3, 1, 1)

    @bentoml.api
    def classify(self, image: Image) -> dict:
        image = image.convert("RGB")
        w, h = image.size
        scale = self.resize / min(w, h)
        image = image.resize((round(w * scale), round(h * scale)))
        left, top = (image.width - self.crop) // 2, (image.height - self.crop) // 2
        image = image.crop((left, top, left + self.crop, top + self.crop))
        x = (np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / 255 - self.mean) / self.std
        logits = self.session.run(None, {"input": x[None]})[0][0]
        return {"index": int(logits.argmax())}
