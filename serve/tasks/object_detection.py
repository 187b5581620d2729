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
  uploaded image's pixels (after its EXIF rotation), at most the model's detections per image; Mask R-CNN adds each
  detection's `mask` (COCO's compressed RLE, `{"size": [height, width], "counts"}`, contract/instances.py), Keypoint
  R-CNN its `keypoints` (`[[x, y, score], ...]` in the model's keypoint order), both in the upload's pixels;
- the protocol: `image` BYTES [N] in; Triton's detection layout out, padded to D (the model's detections per
  image): `num_detections` INT32 [N], `detection_boxes` FP32 [N, D, 4] (x1, y1, x2, y2 in pixels),
  `detection_scores` FP32 [N, D], `detection_classes` INT64 [N, D] (padding rows: zeros); Mask R-CNN's
  `detection_masks` FP32 [N, D, M, M] (each the probabilities over its box, as torchvision's roi_heads give them
  before pasting: a client pastes them with torchvision's paste_masks_in_image), Keypoint R-CNN's
  `detection_keypoints` FP32 [N, D, K, 3] (x, y in pixels, score).

Masks are pasted (M x M probabilities into the box, as torchvision pastes them) in a worker thread, in the
upload's pixels and only inside each box; a box of more than MASK_PIXELS (in an upload much larger than the model's
input) is pasted at the size the model saw and scaled up in the run-length code, without building the upload-sized
picture, so a request's masks cost a bounded amount whatever the upload's size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from contract.instances import (
    MASK_THRESHOLD,
    paste_mask,
    paste_region,
    pasted_box,
    rle,
    rle_of_region,
    source_index,
)
from contract.manifest import labels_of
from contract.pil_transform import Preprocessor
from contract.signature import TASK_OBJECT_DETECTION
from serve.http.endpoint import Answer, Endpoint, Incoming
from serve.protocols.oip_codec import InferRequest, OutputTensor
from serve.protocols.tensors import IMAGE_INPUT, ServedTensor, select_outputs
from serve.tasks.base import ProtocolTask, Serving, only_params
from serve.tasks.images import IMAGE_FIELDS, OneImageEach, each_image, image_route

SMALL_ENOUGH = 2  # an upload of up to twice the model's input pixels goes to the graph as it is
# A mask is pasted at the upload's pixels where its box covers at most this many (a 28 x 28 mask holds no more
# detail past it); a larger one, at the model's input size and scaled: a request's masks cost 100 x this at most.
MASK_PIXELS = 1 << 20


@dataclass(frozen=True)
class Frame:
    """Where an upload's detections are answered: its size, and the size of the copy the graph was given."""

    upload: tuple[int, int]  # (height, width)
    model_input: tuple[int, int]

    @property
    def scale(self) -> tuple[float, float]:
        """From the graph's pixels to the upload's (x, y)."""
        return self.upload[1] / self.model_input[1], self.upload[0] / self.model_input[0]

    def boxes(self, boxes: np.ndarray) -> np.ndarray:
        """Boxes (..., 4: x1, y1, x2, y2) in the upload's pixels."""
        if self.upload == self.model_input:
            return boxes
        x, y = self.scale
        return (boxes * np.array([x, y, x, y], dtype=np.float32)).astype(np.float32)

    def keypoints(self, keypoints: np.ndarray) -> np.ndarray:
        """Keypoints (..., 3: x, y, score) in the upload's pixels."""
        if self.upload == self.model_input:
            return keypoints
        x, y = self.scale
        return (keypoints * np.array([x, y, 1], dtype=np.float32)).astype(np.float32)

    def mask(self, small: np.ndarray, box: np.ndarray) -> dict[str, Any]:
        """One detection's M x M mask, `box` in the graph's pixels, as COCO's RLE in the upload's pixels: pasted
        there as torchvision pastes it, or, for a box past MASK_PIXELS there, at the model's input and scaled."""
        in_upload = self.boxes(box)
        x1, y1, x2, y2 = pasted_box(in_upload, small.shape[-1])
        if (x2 - x1 + 1) * (y2 - y1 + 1) <= MASK_PIXELS or self.upload == self.model_input:
            top, left, region = paste_region(small, in_upload, *self.upload)
            return rle_of_region(region > MASK_THRESHOLD, top, left, *self.upload)
        return rle(paste_mask(small, box, *self.model_input) > MASK_THRESHOLD, self.upload)


def resize_like_torch(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """An H x W x 3 uint8 image resized to 3 x `height` x `width` floats in 0..1 as torch's
    `interpolate(mode="bilinear", align_corners=False)` resizes the image's floats: only the rows and columns it
    reads are taken from the 8-bit pixels, so memory follows the output's size, not the upload's."""
    top, bottom, down = source_index(pixels.shape[0], height)
    left, right, across = source_index(pixels.shape[1], width)
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
                    "mask": {
                        "type": "object",
                        "description": "Mask R-CNN: COCO's compressed RLE in the upload's pixels",
                        "properties": {
                            "size": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
                            "counts": {"type": "string"},
                        },
                    },
                    "keypoints": {
                        "type": "array",
                        "description": "Keypoint R-CNN: [x, y, score] for each of the model's keypoints",
                        "items": {"type": "array", "items": {"type": "number"}, "minItems": 3, "maxItems": 3},
                    },
                },
            },
        }
    },
    "required": ["detections"],
}


class ObjectDetection(ProtocolTask):
    """A detector's labels, settings and decoding, from its manifest."""

    name = TASK_OBJECT_DETECTION
    kind = "a detector"
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

    def prepare(self, upload: bytes) -> tuple[dict[str, np.ndarray], Frame]:
        """An upload as the graph's input, and its Frame; ClientError for one it cannot take."""
        image: Image.Image = self.decoder.decode(upload).convert("RGB")
        width, height = image.size
        target = self.model_size(height, width)
        if height * width <= SMALL_ENOUGH * target[0] * target[1]:
            pixels = np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / np.float32(255.0)
            return {"image": np.ascontiguousarray(pixels[None])}, Frame((height, width), (height, width))
        if self.model_size(*target) != target:  # the graph would resize that size again: give it twice as much
            target = (min(height, 2 * target[0]), min(width, 2 * target[1]))
        pixels = resize_like_torch(np.asarray(image), *target)
        return {"image": pixels[None]}, Frame((height, width), target)

    def endpoints(self) -> list[Endpoint]:
        return [
            image_route(
                "/detect",
                "a detector's detections, best first, boxes in the image's pixels: an image (a multipart form with "
                "`image`, or the image as the body)",
                self.detect,
                ("application/json", DETECTIONS),
                IMAGE_FIELDS,
            )
        ]

    async def detect(self, request: Incoming) -> Answer:
        """POST /detect: one image, the multipart form's file or a raw body's bytes."""
        only_params(request.params, set())
        rows, frame = await self.serving.decoders.run(self.prepare, request.body)
        outputs = await self.serving.batched(rows)
        return Answer(await self.serving.decoders.run(self.detections, outputs, frame))

    def detections(self, outputs: dict[str, np.ndarray], frame: Frame) -> dict[str, Any]:
        """/detect's answer for one image's outputs (1 x D each), best first, in the upload's pixels."""
        scores = outputs["scores"][0]
        order = np.argsort(-scores, kind="stable")
        boxes = outputs["boxes"][0][order]
        found = [
            {"label": self.labels[index], "index": index, "score": score, "box": box}
            for index, score, box in zip(
                outputs["labels"][0][order].tolist(), scores[order].tolist(), frame.boxes(boxes).tolist(), strict=True
            )
        ]
        if "masks" in outputs:
            for detection, small, box in zip(found, outputs["masks"][0][order], boxes, strict=True):
                detection["mask"] = frame.mask(small, box)
        if "keypoints" in outputs:
            for detection, points in zip(found, frame.keypoints(outputs["keypoints"][0][order]).tolist(), strict=True):
                detection["keypoints"] = points
        return {"detections": found}

    def protocol_outputs(self, answers: list[dict[str, np.ndarray]], frames: list[Frame]) -> dict[str, np.ndarray]:
        """The protocol's outputs for N images: each image's detections, best first, padded to D."""
        most = self.settings["detections_per_image"]
        count = np.zeros(len(answers), dtype=np.int32)
        padded = {name: np.zeros((len(answers), most, *shape), dtype=dtype) for name, (shape, dtype) in self._padded()}
        for i, (outputs, frame) in enumerate(zip(answers, frames, strict=True)):
            order = np.argsort(-outputs["scores"][0], kind="stable")[:most]
            count[i] = len(order)
            padded["detection_boxes"][i, : len(order)] = frame.boxes(outputs["boxes"][0][order])
            padded["detection_scores"][i, : len(order)] = outputs["scores"][0][order]
            padded["detection_classes"][i, : len(order)] = outputs["labels"][0][order]
            if "detection_masks" in padded:
                padded["detection_masks"][i, : len(order)] = outputs["masks"][0][order]
            if "detection_keypoints" in padded:
                padded["detection_keypoints"][i, : len(order)] = frame.keypoints(outputs["keypoints"][0][order])
        return {"num_detections": count, **padded}

    def _padded(self) -> list[tuple[str, tuple[tuple[int, ...], type]]]:
        """Each padded output's shape past N x D, and its dtype."""
        masks, keypoints = self.settings.get("masks"), self.settings.get("keypoints")
        return [
            ("detection_boxes", ((4,), np.float32)),
            ("detection_scores", ((), np.float32)),
            ("detection_classes", ((), np.int64)),
            *([("detection_masks", ((masks["resolution"],) * 2, np.float32))] if masks else []),
            *([("detection_keypoints", ((keypoints, 3), np.float32))] if keypoints else []),
        ]

    def protocol_tensors(self) -> tuple[list[ServedTensor], list[ServedTensor]]:
        """Encoded images in, Triton's detection layout out."""
        kinds: dict[type, str] = {np.float32: "FP32", np.int64: "INT64"}
        outputs = [ServedTensor("num_detections", "INT32", (-1,))] + [
            ServedTensor(name, kinds[dtype], (-1, -1, *shape)) for name, (shape, dtype) in self._padded()
        ]
        return [ServedTensor(IMAGE_INPUT, "BYTES", (-1, 1))], outputs

    async def infer(self, request: InferRequest) -> list[OutputTensor]:
        async def prepare(data: bytes) -> tuple[dict[str, np.ndarray], Frame]:
            return await self.serving.decoders.run(self.prepare, data)

        answers, frames = await each_image(request, self.config.max_batch_size, prepare, self.serving.batched)
        outputs = await self.serving.decoders.run(self.protocol_outputs, answers, frames)
        return select_outputs(request, outputs, None)

    def info(self) -> dict[str, Any]:
        return super().info() | {"labels": self.labels, "detection": self.settings}
