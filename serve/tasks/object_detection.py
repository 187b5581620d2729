"""A detector's serving side: an image in, its detections out, on POST /detect and the protocol's infer.

The export (export/tasks/object_detection.py) is one ONNX graph that takes one image at its own size (1 x 3 x H x W,
RGB in 0..1) and does what torchvision's model does: resize, normalize, detect, NMS, the model's score threshold
and detections per image, boxes in the image's own pixels. So the service decodes the upload (the same checks as
/classify: formats, the pixel limit, EXIF orientation) and hands the pixels over. Images of any sizes share a
batch; the batch runs one image per call (`OneImageEach`), in the model thread.

An upload much larger than the model's input (a 6000 x 6000 PNG for a detector that resizes to 320) is not handed
over whole in float32 (1.4 GB in flight, security round 4): the service resizes it first, to the very size the
graph would, with the graph's own sampling (`resize_like_torch`: bilinear, half-pixel centres, no antialiasing, as
torch's interpolate), reading the 8-bit pixels and writing floats only at that size; the graph's resize is then
the identity, and the boxes are scaled back to the upload's pixels. Where the graph would not map that size onto
itself (its rounding, for a few sizes), it is given twice that size, still bounded.

Answers:
- /detect: `{"detections": [{"label", "index", "score", "box": [x1, y1, x2, y2]}, ...]}` best first, boxes in the
  uploaded image's pixels (after its EXIF rotation), at most the model's detections per image;
- the protocol: `image` BYTES [N] in; Triton's detection layout out, padded to D (the model's detections per
  image): `num_detections` INT32 [N], `detection_boxes` FP32 [N, D, 4] (x1, y1, x2, y2 in pixels),
  `detection_scores` FP32 [N, D], `detection_classes` INT64 [N, D] (padding rows: zeros).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from PIL import Image

from contract.manifest import labels_of
from contract.pil_transform import Preprocessor
from contract.signature import TASK_OBJECT_DETECTION
from serve.endpoint import Answer, Incoming, RouteSchema
from serve.oip import IMAGE_INPUT, ServedTensor, select_outputs
from serve.oip_codec import InferRequest, OutputTensor
from serve.tasks.base import ServedTask, Serving, only_params
from serve.tasks.images import OneImageEach, each_image

DETECTION_OUTPUTS = ("num_detections", "detection_boxes", "detection_scores", "detection_classes")
SMALL_ENOUGH = 2  # an upload of up to twice the model's input pixels goes to the graph as it is


def _scaled(boxes: np.ndarray, scale: tuple[float, float]) -> np.ndarray:
    if scale == (1.0, 1.0):
        return boxes
    return (boxes * np.array([scale[0], scale[1], scale[0], scale[1]], dtype=np.float32)).astype(np.float32)


def _source_index(size_in: int, size_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """torch's bilinear source indices and weights along one axis (align_corners=False, no antialiasing)."""
    scale = np.float32(size_in / size_out)
    source = np.maximum((np.arange(size_out, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5), 0)
    first = np.minimum(source.astype(np.int64), size_in - 1)
    second = np.minimum(first + 1, size_in - 1)
    return first, second, (source - first).astype(np.float32)


def resize_like_torch(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """An H x W x 3 uint8 image resized to 3 x `height` x `width` floats in 0..1 as torch's
    `interpolate(mode="bilinear", align_corners=False)` resizes the image's floats: only the rows and columns it
    reads are taken from the 8-bit pixels, so memory follows the output's size, not the upload's."""
    top, bottom, down = _source_index(pixels.shape[0], height)
    left, right, across = _source_index(pixels.shape[1], width)
    out = np.empty((3, height, width), dtype=np.float32)
    for channel in range(3):
        plane = pixels[:, :, channel]
        upper = plane[top][:, left] * (1 - across) + plane[top][:, right] * across
        lower = plane[bottom][:, left] * (1 - across) + plane[bottom][:, right] * across
        out[channel] = (upper * (1 - down)[:, None] + lower * down[:, None]) / np.float32(255.0)
    return out


DETECTIONS = {
    "type": "object",
    "properties": {
        "detections": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "label": {"type": "string"},
                    "index": {"type": "integer"},
                    "score": {"type": "number"},
                    "box": {"type": "array", "items": {"type": "number"}, "minItems": 4, "maxItems": 4},
                },
            },
        }
    },
    "required": ["detections"],
}


class ObjectDetection(ServedTask):
    """A detector's labels, settings and decoding, from its manifest."""

    name = TASK_OBJECT_DETECTION
    routes = ("/detect",)
    runs_alone = True

    def __init__(self, serving: Serving) -> None:
        super().__init__(serving)
        self.labels: list[str] = labels_of(self.manifest) or []
        self.settings: dict[str, Any] = self.manifest["detection"]
        self.batch_shape = OneImageEach()
        # /classify's decoding and checks; `resize` is the model's own shorter side, for the size checks
        shortest = min(self.settings["min_size"])
        self.decoder = Preprocessor(shortest, shortest, np.zeros(3), np.ones(3), "bilinear", self.config.max_pixels)

    def model_size(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) the graph resizes an image to, as torchvision computes it in eager mode."""
        fixed = self.settings.get("fixed_size")
        if fixed:
            return int(fixed[1]), int(fixed[0])
        shortest, longest = self.settings["min_size"][-1], self.settings["max_size"]
        scale = min(shortest / min(height, width), longest / max(height, width))
        return math.floor(height * scale), math.floor(width * scale)

    def prepare(self, upload: bytes) -> tuple[dict[str, np.ndarray], tuple[float, float]]:
        """An upload as the graph's input, and how its boxes scale back to the upload's pixels (x, y); ClientError for
        one it cannot take."""
        image: Image.Image = self.decoder.decode(upload).convert("RGB")
        width, height = image.size
        target = self.model_size(height, width)
        if height * width <= SMALL_ENOUGH * target[0] * target[1]:
            pixels = np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / np.float32(255.0)
            return {"image": np.ascontiguousarray(pixels[None])}, (1.0, 1.0)
        if self.model_size(*target) != target:  # the graph would resize that size again: give it twice as much
            target = (min(height, 2 * target[0]), min(width, 2 * target[1]))
        pixels = resize_like_torch(np.asarray(image), *target)
        return {"image": pixels[None]}, (width / target[1], height / target[0])

    async def answer(self, route: str, request: Incoming) -> Answer:
        """/detect: one image, the multipart form's file or a raw body's bytes."""
        only_params(request.params, set())
        rows, scale = await self.serving.decoders.run(self.prepare, request.body)
        return Answer(self.detections(await self.serving.batched(rows), scale))

    def detections(self, outputs: dict[str, np.ndarray], scale: tuple[float, float] = (1.0, 1.0)) -> dict[str, Any]:
        """/detect's answer for one image's outputs (1 x D each), best first, boxes in the upload's pixels."""
        scores = outputs["scores"][0]
        order = np.argsort(-scores, kind="stable")
        boxes = (_scaled(outputs["boxes"][0], scale)[order]).tolist()
        labels = outputs["labels"][0][order].tolist()
        return {
            "detections": [
                {"label": self.labels[index], "index": index, "score": score, "box": box}
                for index, score, box in zip(labels, scores[order].tolist(), boxes, strict=True)
            ]
        }

    def protocol_outputs(
        self, answers: list[dict[str, np.ndarray]], scales: list[tuple[float, float]]
    ) -> dict[str, np.ndarray]:
        """The protocol's outputs for N images: each image's detections, best first, padded to D."""
        most = self.settings["detections_per_image"]
        count = np.zeros(len(answers), dtype=np.int32)
        boxes = np.zeros((len(answers), most, 4), dtype=np.float32)
        scores = np.zeros((len(answers), most), dtype=np.float32)
        classes = np.zeros((len(answers), most), dtype=np.int64)
        for i, outputs in enumerate(answers):
            order = np.argsort(-outputs["scores"][0], kind="stable")[:most]
            count[i] = len(order)
            boxes[i, : len(order)] = _scaled(outputs["boxes"][0], scales[i])[order]
            scores[i, : len(order)] = outputs["scores"][0][order]
            classes[i, : len(order)] = outputs["labels"][0][order]
        return dict(zip(DETECTION_OUTPUTS, (count, boxes, scores, classes), strict=True))

    def protocol_tensors(self) -> tuple[list[ServedTensor], list[ServedTensor]]:
        """Encoded images in, Triton's detection layout out."""
        outputs = [
            ServedTensor("num_detections", "INT32", (-1,)),
            ServedTensor("detection_boxes", "FP32", (-1, -1, 4)),
            ServedTensor("detection_scores", "FP32", (-1, -1)),
            ServedTensor("detection_classes", "INT64", (-1, -1)),
        ]
        return [ServedTensor(IMAGE_INPUT, "BYTES", (-1, 1))], outputs

    async def infer(self, request: InferRequest) -> list[OutputTensor]:
        async def prepare(data: bytes) -> tuple[dict[str, np.ndarray], tuple[float, float]]:
            return await self.serving.decoders.run(self.prepare, data)

        answers, scales = await each_image(request, self.config.max_batch_size, prepare, self.serving.batched)
        return select_outputs(request, self.protocol_outputs(answers, scales), None)

    def info(self) -> dict[str, Any]:
        return super().info() | {"labels": self.labels, "detection": self.settings}

    def schemas(self) -> dict[str, RouteSchema]:
        return {"/detect": RouteSchema(answer=("application/json", DETECTIONS))}
