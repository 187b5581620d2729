"""The minimal peer: a plain BentoML image classifier written the way the common examples write it.

One request, one model call; the image decoded by BentoML into a PIL image inside a synchronous API on
BentoML's default thread; no batching; ONNX Runtime with its default session settings. The resize uses the
manifest's interpolation (bilinear for torchvision's models), so the model sees what ours sees.
Used by bench/serve_throughput.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import bentoml
import numpy as np
import PIL.Image
from PIL.Image import Image

FOLDER = Path(os.environ["PEER_MODEL_DIR"])
DEVICE = os.environ.get("PEER_DEVICE", "cpu")
# The same provider and TF32 setting as the service it is compared with (TF32 off); the benchmark asks
# POST /provider and refuses to compare when the session fell back to the CPU.
PROVIDERS = ([("CUDAExecutionProvider", {"use_tf32": 0})] if DEVICE == "cuda" else []) + ["CPUExecutionProvider"]


@bentoml.service(name="peer_minimal")
class MinimalPeer:
    def __init__(self) -> None:
        import onnxruntime as ort

        if DEVICE == "cuda":
            ort.preload_dlls()
        self.session = ort.InferenceSession(str(FOLDER / "model.onnx"), providers=PROVIDERS)
        pre = json.loads((FOLDER / "manifest.json").read_text())["preprocess"]
        self.resize, self.crop = pre["resize"], pre["crop"]
        self.resample = PIL.Image.Resampling[pre["interpolation"].upper()]
        self.mean = np.array(pre["mean"], dtype=np.float32).reshape(3, 1, 1)
        self.std = np.array(pre["std"], dtype=np.float32).reshape(3, 1, 1)

    @bentoml.api(route="/provider")
    def provider(self) -> dict:
        return {"provider": self.session.get_providers()[0]}

    @bentoml.api
    def classify(self, image: Image) -> dict:
        image = image.convert("RGB")
        w, h = image.size
        scale = self.resize / min(w, h)
        image = image.resize((round(w * scale), round(h * scale)), self.resample)
        left, top = (image.width - self.crop) // 2, (image.height - self.crop) // 2
        image = image.crop((left, top, left + self.crop, top + self.crop))
        x = (np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / 255 - self.mean) / self.std
        logits = self.session.run(None, {"input": x[None]})[0][0]
        return {"index": int(logits.argmax())}
