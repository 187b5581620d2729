"""An image-text model (CLIP, SigLIP): image and text embeddings, and zero-shot image classification, from its two
towers (serve/model/towers.py), as transformers answers them.

- POST /embed: texts as text-embeddings-inference takes them (`{"inputs": "text" | ["text", ...], "normalize":
  true}`), or an image (a multipart form's `image`, `normalize` beside it, or the image itself as the body,
  `?normalize=false`) -> `[[...], ...]`: unit vectors by default, the model's projected features with `normalize`
  false (TEI's meaning);
- POST /v1/embeddings: texts as OpenAI's embeddings API takes them -> unit vectors in its answer;
- POST /classify: zero-shot classification, as `pipeline("zero-shot-image-classification")` answers: an image (the
  form's `image`, or the body) and its `candidate_labels` (the form's field or the query string's, repeated or
  comma-separated), each put in the `hypothesis_template` ("This is a photo of {}." unless given) -> `{"predictions":
  [{"label", "score"}, ...]}`, best first; scores by softmax over the labels (CLIP) or a sigmoid each (SigLIP);
- the protocol: `text` (BYTES [N]) or `image` (BYTES [N]: encoded images), one of the two; `embeddings` out.

Images share the image tower's calls, texts the text tower's (padded as the export proved: to the longest, or to the
length SigLIP's pipeline pads to); never the two in one call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson

from contract.errors import ClientError
from contract.image_text import ImageTextSettings, unit
from contract.manifest import Manifest
from contract.pil_transform import Preprocessor
from contract.signature import TASK_IMAGE_TEXT
from contract.tokenizer_spec import TokenizerSettings
from serve.config import ServeConfig
from serve.http.endpoint import Answer, Endpoint, Incoming
from serve.http.front_door import MULTIPART, BodyRoute
from serve.model.lanes import Lanes
from serve.model.runtime import Runtime
from serve.model.towers import Towers
from serve.protocols.oip_codec import InferRequest, OutputTensor
from serve.protocols.tensors import IMAGE_INPUT, TEXT_INPUT, ServedTensor, select_outputs
from serve.tasks.base import BINARY, Serving, form_schema, model_route, one_param, only_params
from serve.tasks.images import RAW_IMAGE_TYPES, image_files, image_route
from serve.tasks.text_embedding import VECTORS, TextEmbedding
from serve.tasks.texts import PaddedSequences, checked_text

IMAGE_INPUTS = "pixel_values"  # the image tower's input: a batch holding it is the image tower's
EMBED_FIELDS = {"image": "file", "normalize": "text"}
CLASSIFY_FIELDS = {"image": "file", "candidate_labels": "text", "hypothesis_template": "text"}
MAX_LABELS = 100  # candidate labels in one request (each a text through the text tower)
SCORES = {
    "type": "object",
    "properties": {
        "predictions": {
            "type": "array",
            "items": {"type": "object", "properties": {"label": {"type": "string"}, "score": {"type": "number"}}},
        }
    },
}


class ImagesOrTexts:
    """serve/model/batch_shape.py's batch shape for two towers: images of one size share a call, texts share one
    padded (`PaddedSequences`), never the two together."""

    def __init__(self, texts: PaddedSequences) -> None:
        self.texts = texts

    def key(self, rows: Any) -> tuple:
        return ("image", rows[IMAGE_INPUTS].shape[1:]) if IMAGE_INPUTS in rows else ("text",)

    def join(self, parts: list[Any]) -> Any:
        if IMAGE_INPUTS in parts[0]:
            return {IMAGE_INPUTS: np.concatenate([part[IMAGE_INPUTS] for part in parts])}
        return self.texts.join(parts)

    def fits(self, parts: list[Any], more: Any) -> bool:
        return IMAGE_INPUTS in more or self.texts.fits(parts, more)

    def groups(self, parts: list[Any]) -> list[list[int]]:
        return [list(range(len(parts)))] if IMAGE_INPUTS in parts[0] else self.texts.groups(parts)


class ImageText(TextEmbedding):
    name = TASK_IMAGE_TEXT
    kind = "an image-text model"

    @classmethod
    def own_runtime(cls, config: ServeConfig, folder: Path, manifest: Manifest) -> tuple[Lanes, Runtime]:
        return Towers.arranged(config, folder, manifest, "images or texts, a call on every thread")

    def run(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Either tower's one output (`image_embeds`, `text_embeds`) as the sentence encoder's `embeddings`."""
        (embeddings,) = self.serving.runtime.run_named(rows).values()
        return {"embeddings": embeddings}

    def __init__(self, serving: Serving) -> None:
        super().__init__(serving)
        self.settings = ImageTextSettings.from_manifest(self.manifest["image_text"])
        self.preprocessor = Preprocessor.from_manifest(self.manifest["preprocess"], self.config.max_pixels)
        texts = TokenizerSettings.from_manifest(self.manifest["tokenizer"])
        self.batch_shape = ImagesOrTexts(PaddedSequences(texts, max(self.config.max_batch_tokens, texts.max_length)))

    def endpoints(self) -> list[Endpoint]:
        embed, openai, _ = super().endpoints()  # the sentence encoder's /embed and /v1/embeddings, for texts
        takes = "/embed takes texts as JSON, or an image (a multipart form's image, or the image as the body)"
        form = form_schema(EMBED_FIELDS)
        request = {**embed.request, MULTIPART: {"schema": form}, **{t: {"schema": BINARY} for t in RAW_IMAGE_TYPES}}
        embed = model_route(
            "/embed",
            'vectors of texts, as text-embeddings-inference answers ({"inputs": text or [texts], "normalize": '
            "true}), or of an image (a multipart form with `image` and `normalize`, or the image as the body) -> "
            "[[...], ...]",
            self.embed_either,
            BodyRoute(frozenset(request), EMBED_FIELDS, takes=takes),
            request,
            ("application/json", VECTORS),
            ({"name": "normalize", "in": "query", "required": False, "schema": {"type": "boolean"}},),
        )
        labels = {"name": "candidate_labels", "in": "query", "required": False, "schema": {"type": "string"}}
        template = {"name": "hypothesis_template", "in": "query", "required": False, "schema": {"type": "string"}}
        classify = image_route(
            "/classify",
            "zero-shot classification of an image among candidate_labels, as transformers' zero-shot image pipeline "
            "answers: a multipart form with `image`, `candidate_labels` and `hypothesis_template`, or the image as "
            "the body with them in the query string",
            self.classify,
            ("application/json", SCORES),
            CLASSIFY_FIELDS,
            query=(labels, template),
        )
        return [embed, openai, classify]

    async def embed_either(self, request: Incoming) -> Answer:
        """POST /embed: texts (JSON), as the sentence encoder's; or an image."""
        if request.content_type == "application/json":
            return await self.embed(request)
        only_params(request.params, {"normalize"})
        normalize = one_param(request.params, "normalize", "true")
        if normalize not in ("true", "false"):
            raise ClientError(f"normalize={normalize[:20]}: must be true or false")
        vectors = await self._image_vectors(request.body)
        if normalize == "true":
            vectors = unit(vectors)
        return Answer(orjson.dumps(np.ascontiguousarray(vectors, dtype=np.float32), option=orjson.OPT_SERIALIZE_NUMPY))

    async def classify(self, request: Incoming) -> Answer:
        """POST /classify: an image's scores for its candidate labels, best first, as the pipeline answers."""
        only_params(request.params, {"candidate_labels", "hypothesis_template"})
        labels = self._labels(request.params.get("candidate_labels", []))
        template = one_param(request.params, "hypothesis_template", self.settings.hypothesis_template)
        if "{}" not in template:
            raise ClientError('hypothesis_template must hold "{}", where each candidate label goes')
        hypotheses = [checked_text(template.format(label), self.max_chars, "a hypothesis") for label in labels]
        encoded = await self.tokenized(sum(map(len, hypotheses)), self.tokenizer.encode, hypotheses)
        image_vector = await self._image_vectors(request.body)
        text_vectors = (await self.serving.batched(encoded.rows))["embeddings"]
        scores = self.settings.zero_shot(image_vector, text_vectors)[0]
        order = sorted(range(len(labels)), key=lambda i: -scores[i])  # stable: ties keep the labels' order
        return Answer({"predictions": [{"label": labels[i], "score": float(scores[i])} for i in order]})

    def _labels(self, given: list[str]) -> list[str]:
        """candidate_labels, repeated or comma-separated (as Hugging Face's widget sends them), each a text."""
        labels = [label.strip() for value in given for label in value.split(",") if label.strip()]
        if not labels:
            raise ClientError("send candidate_labels: the classes to choose among (repeated, or comma-separated)")
        if len(labels) > MAX_LABELS:
            raise ClientError(f"{len(labels)} candidate_labels; at most {MAX_LABELS}")
        return [checked_text(label, self.max_chars, "a candidate label") for label in labels]

    async def _image_vectors(self, upload: bytes) -> np.ndarray:
        pixels = await self.serving.decoders.run(self._pixels, upload)
        return (await self.serving.batched({IMAGE_INPUTS: pixels[None]}))["embeddings"]

    def _pixels(self, upload: bytes) -> np.ndarray:
        return self.preprocessor(self.preprocessor.decode(upload))

    def protocol_tensors(self) -> tuple[list[ServedTensor], list[ServedTensor]]:
        inputs = [
            ServedTensor(TEXT_INPUT, "BYTES", (-1,), optional=True),
            ServedTensor(IMAGE_INPUT, "BYTES", (-1, 1), optional=True),
        ]
        width = int(self.embedding["dimensions"])
        return inputs, [ServedTensor("embeddings", "FP32", (-1, width))]

    async def infer(self, request: InferRequest) -> list[OutputTensor]:
        if set(request.inputs) not in ({TEXT_INPUT}, {IMAGE_INPUT}):
            given = ", ".join(sorted(request.inputs))
            raise ClientError(f"send one input, 'text' (BYTES [N]) or 'image' (BYTES [N]: encoded images); got {given}")
        if TEXT_INPUT in request.inputs:
            _, encoded = await self.protocol_texts(request)
            return select_outputs(request, await self.serving.batched(encoded.rows), None)
        files = image_files(request, self.config.max_batch_size)
        pixels = await self.serving.decoders.run(lambda: np.stack([self._pixels(data) for data in files]))
        return select_outputs(request, await self.serving.batched({IMAGE_INPUTS: pixels}), None)

    def info(self) -> dict[str, Any]:
        runtime = self.serving.runtime
        towers = runtime.info() if isinstance(runtime, Towers) else {}
        return super().info() | {"image_text": self.manifest["image_text"], "towers": towers}
