"""A text classifier's serving side: the tokenizer it was trained with, texts in, padded batches to the model.

The export (export/tasks/text_classification.py) copies the tokenizer into the folder as `tokenizer.json` and
records its settings in the manifest (`tokenizer`); the service builds it with the `tokenizers` library (no
transformers, no torch) from the bytes checked against the manifest. A text longer than the model's maximum is
truncated to it, as the tokenizer was set to do in training, and the answer says so (`"truncated": true`); a text
past HANDOFF_MAX_TEXT_CHARS is refused (413) before it is tokenized.

- POST /classify: `{"text": "...", "top_k": K}` or text/plain (`?top_k=K`) -> predictions and `truncated`; a pair
  `{"text": "...", "text_pair": "..."}`, as transformers' text-classification pipeline takes it, truncated
  longest-first, for any model whose tokenizer encodes pairs (`takes_pairs` in the manifest's tokenizer); a model
  exported with --text-pairs (`pairs`) takes only pairs;
- POST /predict: token ids by name, as any model's inputs;
- the protocol: `text` (BYTES: UTF-8 texts; `text_pair` beside them for pairs) in, `logits` and `probabilities`
  out.

Requests of different lengths share a batch (`PaddedSequences`): each is padded to the longest in its batch with
the pad token and a zero attention mask, which the export proved leaves every row's answer as it is alone. A batch
holds at most `max_tokens` padded tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from contract.errors import ClientError
from contract.manifest import labels_of
from contract.signature import TASK_TEXT_CLASSIFICATION
from contract.tokenizer_spec import Encoded
from serve.http.endpoint import Answer, Endpoint, Incoming
from serve.protocols.oip_codec import InferRequest, OutputTensor
from serve.protocols.tensors import ServedTensor
from serve.tasks.base import TOP_K, Serving, checked_top_k, json_route
from serve.tasks.ranking import (
    CLASSIFIER_OUTPUTS,
    PREDICTIONS,
    classifier_outputs,
    predictions,
    ranked,
    with_probabilities,
)
from serve.tasks.texts import TextTask, checked_text, text_bodies, text_of_body


class TextClassification(TextTask):
    """A text classifier's labels, beside what every text task has."""

    name = TASK_TEXT_CLASSIFICATION
    kind = "a text classifier"

    def __init__(self, serving: Serving) -> None:
        super().__init__(serving)
        self.labels: list[str] = labels_of(self.manifest) or []
        self.scores: str = self.manifest.get("scores", "softmax")  # older exports: softmax
        self.score_key = "score" if self.scores == "none" else "probability"  # a regression head's are no probabilities

    def run(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return ranked(self.serving.runtime.run_named(rows)["logits"], self.scores)

    def endpoints(self) -> list[Endpoint]:
        text = {
            "type": "object",
            "properties": {"text": {"type": "string"}, "text_pair": {"type": "string"}, "top_k": TOP_K},
            "required": ["text"],
            "additionalProperties": False,
        }
        answer = {**PREDICTIONS, "properties": {**PREDICTIONS["properties"], "truncated": {"type": "boolean"}}}
        classify = json_route(
            "/classify",
            'classes, best first, for a text: {"text": ..., "top_k": K} or text/plain (?top_k=K); a pair model\'s '
            '{"text": ..., "text_pair": ...}',
            self.classify,
            text,
            answer,
            media_types=text_bodies(text),
            takes=f"this model classifies text: send {self.body_example} (application/json)",
            query=({"name": "top_k", "in": "query", "required": False, "schema": TOP_K},),
        )
        return [classify, self.predict_route()]

    async def classify(self, request: Incoming) -> Answer:
        """POST /classify: a text, `{"text": "...", "top_k": K}` or text/plain (`?top_k=K`), tokenized (on the event
        loop if short, else in a decoding thread: TextTask.tokenized)."""
        encoded, top_k = await self.tokenized(
            len(request.body), self.encode_body, request.body, request.content_type, request.params
        )
        top_k = checked_top_k(top_k)
        outputs = await self.serving.batched(encoded.rows)
        return Answer(
            {"predictions": predictions(outputs, self.labels, top_k, self.score_key), "truncated": encoded.truncated[0]}
        )

    @property
    def body_example(self) -> str:
        settings = self.tokenizer.settings
        if settings.pairs:
            return '{"text": "...", "text_pair": "..."}'
        return (
            '{"text": "..."} (with "text_pair": "..." for a pair) or text/plain'
            if settings.takes_pairs
            else ('{"text": "..."} or text/plain')
        )

    def encode_body(self, body: bytes, content_type: str, params: dict[str, list[str]]) -> tuple[Encoded, Any]:
        """POST /classify's body as the model's rows (a text, or a pair model's pair), and its top_k (the JSON's,
        else the query string's)."""
        text, fields = text_of_body(body, content_type, self.max_chars, {"text_pair": '"..."', "top_k": "K"})
        if params.keys() - {"top_k"}:
            raise ClientError(
                f"unknown query parameter(s) {', '.join(sorted(params.keys() - {'top_k'}))}; expected top_k"
            )
        top_k = fields.get("top_k", params.get("top_k", ["5"])[-1])
        pair = fields.get("text_pair")
        settings = self.tokenizer.settings
        if settings.pairs and pair is None:
            raise ClientError(f"this model reads a pair of texts: send {self.body_example}")
        if pair is not None and not settings.any_pairs:
            raise ClientError("this model's tokenizer does not encode pairs of texts: send one text, without text_pair")
        if pair is None:
            return self.tokenizer.encode([text]), top_k
        return self.tokenizer.encode_pairs([(text, checked_text(pair, self.max_chars, '"text_pair"'))]), top_k

    def protocol_tensors(self) -> tuple[list[ServedTensor], list[ServedTensor]]:
        """Texts in, the logits and their probabilities (softmax or sigmoid, the manifest's `scores`) out."""
        inputs, outputs = super().protocol_tensors()
        return inputs, outputs if self.scores == "none" else with_probabilities(outputs)

    async def infer(self, request: InferRequest) -> list[OutputTensor]:
        _, encoded = await self.protocol_texts(request)
        names = ("logits",) if self.scores == "none" else CLASSIFIER_OUTPUTS
        return classifier_outputs(request, await self.serving.batched(encoded.rows), self.labels, names)

    def info(self) -> dict[str, Any]:
        return super().info() | {"labels": self.labels, "scores": self.scores, "tokenizer": self.manifest["tokenizer"]}
