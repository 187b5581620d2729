"""A detector's serving side: an image in, its detections out, on POST /detect and the protocol's infer.

The export (export/detection_export.py) is one ONNX graph that takes one image at its own size (1 x 3 x H x W,
RGB in 0..1) and does what torchvision's model does: resize, normalize, detect, NMS, the model's score threshold
and detections per image, boxes in the image's own pixels. So the service only decodes the upload (the same
checks as /classify: formats, the pixel limit, EXIF orientation) and hands the pixels over. Images of any sizes
share a batch; the batch runs one image per call (`OneImageEach`), in the model thread.

Answers:
- /detect: `{"detections": [{"label", "index", "score", "box": [x1, y1, x2, y2]}, ...]}` best first, boxes in the
  uploaded image's pixels (after its EXIF rotation), at most the model's detections per image;
- the protocol: `image` BYTES [N] in; Triton's detection layout out, padded to D (the model's detections per
  image): `num_detections` INT32 [N], `detection_boxes` FP32 [N, D, 4] (x1, y1, x2, y2 in pixels),
  `detection_scores` FP32 [N, D], `detection_classes` INT64 [N, D] (padding rows: zeros).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

from train.pil_transform import Preprocessor

DETECTION_OUTPUTS = ("num_detections", "detection_boxes", "detection_scores", "detection_classes")


class OneImageEach:
    """serve/batching.py's batch shape for images of their own sizes: any share a batch, each runs alone."""

    def key(self, rows: Any) -> tuple:
        return ()

    def join(self, parts: list[Any]) -> Any:
        (only,) = parts
        return only

    def fits(self, parts: list[Any], more: Any) -> bool:
        return True

    def groups(self, parts: list[Any]) -> list[list[int]]:
        return [[i] for i in range(len(parts))]


class Detector:
    """A detector's labels, settings and decoding, from its manifest."""

    def __init__(self, manifest: dict[str, Any], max_pixels: int) -> None:
        self.labels: list[str] = manifest["labels"]
        self.settings: dict[str, Any] = manifest["detection"]
        self.batch_shape = OneImageEach()
        # /classify's decoding and checks; `resize` is the model's own shorter side, for the size checks
        shortest = min(self.settings["min_size"])
        self.decoder = Preprocessor(shortest, shortest, np.zeros(3), np.ones(3), "bilinear", max_pixels)

    def prepare(self, upload: bytes) -> dict[str, np.ndarray]:
        """An upload as the graph's input (BadImage for one it cannot take)."""
        image: Image.Image = self.decoder.decode(upload).convert("RGB")
        pixels = np.asarray(image, dtype=np.float32).transpose(2, 0, 1)[None] / np.float32(255.0)
        return {"image": np.ascontiguousarray(pixels)}

    def answer(self, outputs: dict[str, np.ndarray]) -> dict[str, Any]:
        """/detect's answer for one image's outputs (1 x D each), best first."""
        scores = outputs["scores"][0]
        order = np.argsort(-scores, kind="stable")
        boxes, labels = outputs["boxes"][0][order].tolist(), outputs["labels"][0][order].tolist()
        return {
            "detections": [
                {"label": self.labels[index], "index": index, "score": score, "box": box}
                for index, score, box in zip(labels, scores[order].tolist(), boxes, strict=True)
            ]
        }

    def protocol_outputs(self, answers: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """The protocol's outputs for N images: each image's detections, best first, padded to D."""
        most = self.settings["detections_per_image"]
        count = np.zeros(len(answers), dtype=np.int32)
        boxes = np.zeros((len(answers), most, 4), dtype=np.float32)
        scores = np.zeros((len(answers), most), dtype=np.float32)
        classes = np.zeros((len(answers), most), dtype=np.int64)
        for i, outputs in enumerate(answers):
            order = np.argsort(-outputs["scores"][0], kind="stable")[:most]
            count[i] = len(order)
            boxes[i, : len(order)] = outputs["boxes"][0][order]
            scores[i, : len(order)] = outputs["scores"][0][order]
            classes[i, : len(order)] = outputs["labels"][0][order]
        return dict(zip(DETECTION_OUTPUTS, (count, boxes, scores, classes), strict=True))
