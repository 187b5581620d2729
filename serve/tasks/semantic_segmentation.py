"""A segmenter's serving side: an image in, the class of each of its pixels out, on POST /segment and the protocol.

As torchvision's segmentation references evaluate (the export's `segmentation` settings): the upload is decoded
with /classify's checks, its shorter side resized to 520 with Pillow (bilinear), scaled to 0..1; the graph
normalizes it and gives logits at that size; each pixel's best class, taken in the model thread, is mapped back to
the uploaded image's size (nearest). Images of any sizes share a batch; each runs alone (serve/tasks/images.py's
OneImageEach).

Answers:
- /segment: a PNG of the uploaded image's size whose pixel values are class indices (8-bit up to 256 classes,
  else 16-bit); with `?format=json`, `{"width", "height", "classes": [{"label", "index", "share"}, ...]}`, the
  classes present, largest share of the pixels first;
- the protocol: `image` BYTES [N] in; `classes` INT32 [N, H, W] out, each image's mask in its own size, padded to
  the largest H and W of the request with -1.

Bounds (security round 4): an image runs at most MODEL_PHOTOS photos' worth of pixels at the model's size (a
26000 x 520 PNG would run at 520 x 26000, 70 photos' cost): past it, 413 before the model runs. A protocol answer,
N masks padded to the largest height and the largest width, holds at most what one response may carry (the tensor
models' bound, HANDOFF_MAX_BODY_MB x 65,536 numbers): checked as each image's size becomes known, before the model
runs. Masks are resized and padded in the decoding threads, never on the event loop.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image

from contract.errors import ClientError
from contract.manifest import labels_of
from contract.pil_transform import Preprocessor
from contract.signature import TASK_SEMANTIC_SEGMENTATION
from serve.http.endpoint import Answer, Endpoint, Incoming
from serve.protocols.oip_codec import InferRequest, OutputTensor
from serve.protocols.tensors import IMAGE_INPUT, ServedTensor, select_outputs
from serve.tasks.base import BINARY, ProtocolTask, Serving, only_params
from serve.tasks.images import IMAGE_FIELDS, OneImageEach, each_image, image_route

SEGMENT_FORMATS = ("png", "json")
MODEL_PHOTOS = 4  # an image's pixels at the model's size, in 4:3 photos resized to its shorter side


SUMMARY = {
    "type": "object",
    "properties": {
        "width": {"type": "integer"},
        "height": {"type": "integer"},
        "classes": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"label": {"type": "string"}, "index": {"type": "integer"}, "share": {"type": "number"}},
            },
        },
    },
}


class SemanticSegmentation(ProtocolTask):
    """A segmenter's labels, resize and decoding, from its manifest."""

    name = TASK_SEMANTIC_SEGMENTATION
    kind = "a segmenter"
    runs_alone = True

    def __init__(self, serving: Serving) -> None:
        super().__init__(serving)
        self.labels: list[str] = labels_of(self.manifest) or []
        self.settings = self.manifest["segmentation"]
        self.batch_shape = OneImageEach()
        resize = self.settings["resize"]
        interpolation = self.settings["interpolation"]
        self.decoder = Preprocessor(resize, resize, np.zeros(3), np.ones(3), interpolation, self.config.max_pixels)

    def run(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """In the model thread: each pixel's best class (N x H x W), not the logits, goes back to the loop."""
        return {"classes": self.serving.runtime.run_named(rows)["logits"].argmax(axis=1).astype(np.int32)}

    def endpoints(self) -> list[Endpoint]:
        return [
            image_route(
                "/segment",
                "a segmenter's class per pixel, as a PNG of class indices in the image's size (`?format=json`: the "
                "classes present and their share): an image (a multipart form with `image`, or the image as the body)",
                self.segment,
                ("image/png", BINARY),
                IMAGE_FIELDS,
                query=({"name": "format", "in": "query", "required": False, "schema": {"enum": [*SEGMENT_FORMATS]}},),
            )
        ]

    async def segment(self, request: Incoming) -> Answer:
        """POST /segment: one image's mask as a PNG (`?format=png`, the default), or the classes it holds (`json`)."""
        params = request.params | request.query  # a form's request has both
        only_params(params, {"format"})
        form = params.get("format", ["png"])[-1]
        if form not in SEGMENT_FORMATS:
            raise ClientError(f"format={form[:20]}: must be {' or '.join(SEGMENT_FORMATS)}")
        rows, size = await self.serving.decoders.run(self.prepare, request.body)
        outputs = await self.serving.batched(rows)
        # the mask resized to the upload's size and encoded, in a decoding thread: megabytes, never on the event loop
        if form == "json":
            return Answer(await self.serving.decoders.run(lambda: self.summary(self.mask(outputs, size))))
        return Answer(await self.serving.decoders.run(lambda: self.png(self.mask(outputs, size))), "image/png")

    @property
    def max_model_pixels(self) -> int:
        return MODEL_PHOTOS * self.decoder.resize * (self.decoder.resize * 4 // 3)

    def prepare(self, upload: bytes) -> tuple[dict[str, np.ndarray], tuple[int, int]]:
        """An upload as the graph's input, and its own (width, height); ClientError for one it cannot take."""
        image = self.decoder.decode(upload).convert("RGB")
        size = image.size
        width, height = self.decoder.resized_size(*size)
        if width * height > self.max_model_pixels:
            raise ClientError(
                f"image is {size[0]}x{size[1]}: at the model's size, {width}x{height}, it would cost "
                f"{width * height / (self.max_model_pixels / MODEL_PHOTOS):.0f} photos' worth of the model; at most "
                f"{MODEL_PHOTOS} (send a crop, or the image in parts)",
                status=413,
            )
        resized = image.resize((width, height), Image.Resampling.BILINEAR)
        pixels = np.asarray(resized, dtype=np.float32).transpose(2, 0, 1)[None] / np.float32(255.0)
        return {"image": np.ascontiguousarray(pixels)}, size

    def mask(self, outputs: dict[str, np.ndarray], size: tuple[int, int]) -> np.ndarray:
        """One image's classes at its uploaded (width, height), H x W."""
        classes = outputs["classes"][0]
        mode = "L" if len(self.labels) <= 256 else "I;16"
        image = Image.fromarray(classes.astype(np.uint8 if mode == "L" else np.uint16), mode=mode)
        return np.asarray(image.resize(size, Image.Resampling.NEAREST))

    @staticmethod
    def png(mask: np.ndarray) -> bytes:
        buffer = io.BytesIO()
        Image.fromarray(mask).save(buffer, format="PNG")
        return buffer.getvalue()

    def summary(self, mask: np.ndarray) -> dict[str, Any]:
        indices, counts = np.unique(mask, return_counts=True)
        order = np.argsort(-counts, kind="stable")
        return {
            "width": int(mask.shape[1]),
            "height": int(mask.shape[0]),
            "classes": [
                {"label": self.labels[int(indices[k])], "index": int(indices[k]), "share": float(counts[k] / mask.size)}
                for k in order
            ],
        }

    @staticmethod
    def check_answer(sizes: list[tuple[int, int]], max_numbers: int) -> None:
        """ClientError (413) when N masks of these (width, height)s, padded to the largest height and width, would
        hold more numbers than one response may carry: said before the model runs."""
        numbers = len(sizes) * max(h for _, h in sizes) * max(w for w, _ in sizes)
        if numbers > max_numbers:
            raise ClientError(
                f"the answer would hold {numbers} numbers ({len(sizes)} mask(s) padded to the largest height and "
                f"width), more than the {max_numbers} one response may carry (HANDOFF_MAX_BODY_MB x 65,536); send "
                "the images one at a time, or to /segment, which answers each as a PNG",
                status=413,
            )

    def protocol_outputs(self, answers: list[dict[str, np.ndarray]], sizes: list[tuple[int, int]]) -> dict[str, Any]:
        """In a decoding thread: N images' masks, each at its uploaded size, as one INT32 tensor padded with -1."""
        masks = [self.mask(answer, size) for answer, size in zip(answers, sizes, strict=True)]
        height, width = max(m.shape[0] for m in masks), max(m.shape[1] for m in masks)
        classes = np.full((len(masks), height, width), -1, dtype=np.int32)
        for i, mask in enumerate(masks):
            classes[i, : mask.shape[0], : mask.shape[1]] = mask
        return {"classes": classes}

    def protocol_tensors(self) -> tuple[list[ServedTensor], list[ServedTensor]]:
        """Encoded images in, each pixel's class out."""
        return [ServedTensor(IMAGE_INPUT, "BYTES", (-1, 1))], [ServedTensor("classes", "INT32", (-1, -1, -1))]

    async def infer(self, request: InferRequest) -> list[OutputTensor]:
        async def prepare(data: bytes) -> tuple[dict[str, np.ndarray], tuple[int, int]]:
            return await self.serving.decoders.run(self.prepare, data)

        def check(sizes: list[tuple[int, int]]) -> None:  # the answer's size is known now: refused before the model
            self.check_answer(sizes, self.config.max_answer_numbers)

        answers, sizes = await each_image(request, self.config.max_batch_size, prepare, self.serving.batched, check)
        # masks resized and padded in a decoding thread: megabytes, never on the event loop
        outputs = await self.serving.decoders.run(self.protocol_outputs, answers, sizes)
        return select_outputs(request, outputs, None)

    def info(self) -> dict[str, Any]:
        return super().info() | {"labels": self.labels, "segmentation": self.settings}
