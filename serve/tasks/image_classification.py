"""An image classifier (handoff's own checkpoints, the ImageNet example's, torchvision's, timm's): an image in, its
classes best first out.

- POST /classify: an image, the multipart form's `image` (and `top_k`) or the image itself as the body
  (`?top_k=K`); decoded and preprocessed as validation did (contract/pil_transform.py), in a decoding thread;
  -> `{"predictions": [{"label", "index", "probability"}, ...]}`;
- POST /predict: preprocessed rows, `{"tensor": N x C x H x W}` -> `{"logits", "probabilities"}`;
- the protocol: `input` (FP32 rows, preprocessed) or `image` (BYTES: encoded files, decoded as /classify
  decodes them), one of the two; `logits` and `probabilities` out, `classification: k` as Triton's strings.

Requests of one shape share a batch (the batcher's default); the model is warmed up at each batch size a GPU pads
to, so the first real request is not the slow one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from contract.errors import ClientError
from contract.manifest import fast_decode_checked, fast_decode_passed, labels_of
from contract.pil_transform import Preprocessor
from contract.signature import TASK_IMAGE_CLASSIFICATION
from serve.http.endpoint import Answer, Endpoint, Incoming
from serve.http.json_body import float32_rows, max_json_bytes, parse_json
from serve.model.tensor_inputs import model_inputs
from serve.protocols.oip_codec import InferRequest, OutputTensor
from serve.protocols.tensors import IMAGE_INPUT, ServedTensor
from serve.tasks.base import (
    TOP_K,
    ProtocolTask,
    Serving,
    checked_top_k,
    json_route,
    numeric_inputs,
    one_param,
    only_params,
)
from serve.tasks.images import image_files, image_route
from serve.tasks.ranking import PREDICTIONS, classifier_outputs, predictions, ranked, with_probabilities

CLASSIFY_FIELDS = {"image": "file", "top_k": "integer"}  # the multipart form's fields, checked by the front door


class ImageClassification(ProtocolTask):
    name = TASK_IMAGE_CLASSIFICATION
    kind = "an image classifier"

    def __init__(self, serving: Serving) -> None:
        super().__init__(serving)
        self.preprocessor = Preprocessor.from_manifest(self.manifest["preprocess"], self.config.max_pixels)
        self.fast_decode = self.config.decode == "auto" and fast_decode_passed(self.manifest)
        self.input_shape = tuple(self.manifest["input"]["shape"][1:])
        self.labels: list[str] = labels_of(self.manifest) or []
        # softmax, or a multi-label Hugging Face classifier's sigmoid as its pipeline scores it (older: softmax)
        self.scores: str = self.manifest.get("scores", "softmax")

    def run(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        return ranked(self.serving.runtime(rows), self.scores)

    def warm_up(self) -> None:
        for size in self.config.batch_buckets():
            self.serving.runtime(np.zeros((size, *self.input_shape), dtype=np.float32))

    def endpoints(self) -> list[Endpoint]:
        rows = {"type": "array", "description": f"N x {' x '.join(map(str, self.input_shape))} numbers, preprocessed"}
        tensor = {
            "type": "object",
            "properties": {"tensor": rows},
            "required": ["tensor"],
            "additionalProperties": False,
        }
        scores = {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}
        logits = {"type": "object", "properties": {"logits": scores, "probabilities": scores}}
        return [
            image_route(
                "/classify",
                "classes, best first: an image (a multipart form with `image` and `top_k`, or the image as the body)",
                self.classify,
                ("application/json", PREDICTIONS),
                CLASSIFY_FIELDS,
                query=({"name": "top_k", "in": "query", "required": False, "schema": TOP_K},),
            ),
            json_route(
                "/predict",
                "a preprocessed tensor's logits and probabilities",
                self.predict,
                tensor,
                logits,
                # a full batch of this model's input, as JSON text
                max_bytes=max_json_bytes(self.config.max_batch_size, self.input_shape),
            ),
        ]

    async def predict(self, request: Incoming) -> Answer:
        """POST /predict: `{"tensor": N x C x H x W}` -> the logits and probabilities."""
        only_params(request.params, set())
        batch = await self.serving.decoders.run(self._parse_predict, request.body)
        outputs = await self.serving.batched(batch)
        return Answer({"logits": outputs["logits"].tolist(), "probabilities": outputs["probabilities"].tolist()})

    async def classify(self, request: Incoming) -> Answer:
        """POST /classify: an image -> its top_k classes, best first."""
        only_params(request.params, {"top_k"})
        top_k = checked_top_k(one_param(request.params, "top_k", "5"))
        array = await self.serving.decoders.run(self._prepare, request.body)
        outputs = await self.serving.batched(array[None])
        return Answer({"predictions": predictions(outputs, self.labels, top_k)})

    def _prepare(self, upload: bytes) -> np.ndarray:
        return self.preprocessor(self.preprocessor.decode(upload, fast=self.fast_decode))

    def _parse_predict(self, body: bytes) -> np.ndarray:
        document = parse_json(body)
        if not isinstance(document, dict) or set(document) != {"tensor"}:
            raise ClientError('expected a JSON object with one key, "tensor": {"tensor": [[[[...]]]]}')
        return float32_rows(document["tensor"], "tensor", self.input_shape, self.config.max_batch_size)

    def protocol_tensors(self) -> tuple[list[ServedTensor], list[ServedTensor]]:
        (model_input,), outputs = super().protocol_tensors()
        inputs = [
            ServedTensor(model_input.name, model_input.datatype, model_input.shape, optional=True),
            ServedTensor(IMAGE_INPUT, "BYTES", (-1, 1), optional=True),
        ]
        return inputs, with_probabilities(outputs)

    async def infer(self, request: InferRequest) -> list[OutputTensor]:
        unknown = sorted(set(request.inputs) - {"input", IMAGE_INPUT})
        if unknown or len(request.inputs) != 1:
            given = f"got {', '.join(sorted(request.inputs))}"
            raise ClientError(f"send one input, 'input' (FP32 [N, ...]) or 'image' (BYTES [N]); {given}")
        if IMAGE_INPUT in request.inputs:
            files = image_files(request, self.config.max_batch_size)
            batch = await self.serving.decoders.run(self._prepare_files, files)
        else:
            # The signature's checks: FP64 and FP16 converted (a value past the model's float range refused),
            # integers refused (a model trained on floats given pixel values 0-255 would answer confidently and
            # wrongly); float32 rows, as decoded images are, so both kinds of request share batches.
            numbers = numeric_inputs(request, ["input"])
            rows = model_inputs(numbers, self.signature, self.config.max_batch_size)["input"]
            batch = rows.astype(np.float32, copy=False)
        return classifier_outputs(request, await self.serving.batched(batch), self.labels)

    def _prepare_files(self, files: list[bytes]) -> np.ndarray:
        """Encoded images -> the model's rows, each decoded and preprocessed as /classify does (in a thread)."""
        rows = []
        for index, data in enumerate(files):
            try:
                rows.append(self._prepare(data))
            except ClientError as err:
                raise ClientError(f"image[{index}]: {err}", err.status) from None
        return np.stack(rows)

    def info(self) -> dict[str, Any]:
        fields = {k: self.manifest[k] for k in ("num_classes", "input", "preprocess")}
        decode = {
            "setting": self.config.decode,
            "fast_jpeg": self.fast_decode,
            "check": fast_decode_checked(self.manifest),
        }
        return fields | {"labels": self.labels, "decode": decode}
