"""A token classifier's serving side (named entities, parts of speech): a text in, its entities out, as spans of the
original text with a score.

- POST /classify: `{"text": "...", "aggregation": "simple" | "none"}` or the text itself as text/plain
  (`?aggregation=`) -> `{"entities": [...], "truncated": false}`. With "simple" (the default), tokens are grouped
  as transformers' token-classification pipeline groups them (`aggregation_strategy="simple"`: a `B-` tag starts
  an entity, `I-` tokens of its type continue it, the score is their mean, `O` left out): `{"entity_group", "score",
  "word", "start", "end"}`; with "none", each token but `O`'s: `{"entity", "score", "index", "word", "start", "end"}`.
  `start` and `end` are characters of the text as sent, and `word` is that slice of it (the pipeline's is the
  tokenizer's reading of it, lowercased by an uncased one);
- POST /predict: token ids by name, as any model's inputs;
- the protocol: `text` (BYTES [N]) in; `logits` (FP32 [N, tokens, labels], each text's own tokens, padded to the
  request's longest) and `entities` (BYTES [N]: each text's grouped entities as JSON) out.

A request's tokens share the model's call with other requests' (`PaddedSequences`); the export proved each text's
tokens answer in a padded batch as they do alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from contract.errors import ClientError
from contract.manifest import labels_of
from contract.scores import softmax
from contract.signature import TASK_TOKEN_CLASSIFICATION
from contract.tokenizer_spec import Encoded
from serve.http.endpoint import Answer, Endpoint, Incoming
from serve.protocols.oip_codec import InferRequest, OutputTensor
from serve.protocols.tensors import ServedTensor, select_outputs
from serve.tasks.base import Serving, json_route
from serve.tasks.texts import TextTask, text_bodies, text_of_body

AGGREGATIONS = ("simple", "none")
IGNORED = "O"  # the label of a token outside every entity, left out as the pipeline leaves it out


class TokenClassification(TextTask):
    name = TASK_TOKEN_CLASSIFICATION
    kind = "a token classifier"

    def __init__(self, serving: Serving) -> None:
        super().__init__(serving)
        self.labels: list[str] = labels_of(self.manifest) or []
        self.tags = [_tag(label) for label in self.labels]  # each label's BIO prefix and type

    def run(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """In the model thread: each token's label probabilities beside its logits."""
        logits = self.serving.runtime.run_named(rows)["logits"]
        return {"logits": logits, "probabilities": softmax(logits)}

    def endpoints(self) -> list[Endpoint]:
        text = {
            "type": "object",
            "properties": {"text": {"type": "string"}, "aggregation": {"enum": list(AGGREGATIONS)}},
            "required": ["text"],
            "additionalProperties": False,
        }
        entity = {
            "type": "object",
            "properties": {
                "entity_group": {"type": "string"},
                "entity": {"type": "string"},
                "score": {"type": "number"},
                "word": {"type": "string"},
                "start": {"type": "integer"},
                "end": {"type": "integer"},
            },
        }
        answer = {
            "type": "object",
            "properties": {"entities": {"type": "array", "items": entity}, "truncated": {"type": "boolean"}},
        }
        classify = json_route(
            "/classify",
            'the entities a token classifier finds in a text: {"text": ..., "aggregation": ...} or text/plain',
            self.classify,
            text,
            answer,
            media_types=text_bodies(text),
            takes='this model finds entities in text: send {"text": "..."} (application/json) or text/plain',
        )
        return [classify, self.predict_route()]

    async def classify(self, request: Incoming) -> Answer:
        """POST /classify: a text's entities, grouped as the token-classification pipeline's `aggregation`."""
        text, aggregation, encoded = await self.tokenized(
            len(request.body), self._encode_body, request.body, request.content_type, request.params
        )
        outputs = await self.serving.batched(encoded.rows)
        probabilities = self._own_tokens(outputs["probabilities"], encoded)[0]
        entities = self.entities(text, encoded.spans[0], probabilities, aggregation)
        return Answer({"entities": entities, "truncated": encoded.truncated[0]})

    def _encode_body(self, body: bytes, content_type: str, params: dict[str, list[str]]) -> tuple[str, str, Encoded]:
        """/classify's body (where `tokenized` says): its text, the aggregation (the JSON's, else the query string's)
        and the text's tokens."""
        unknown = sorted(set(params) - {"aggregation"})
        if unknown:
            raise ClientError(f"unknown query parameter(s) {', '.join(unknown)}; expected aggregation")
        text, fields = text_of_body(body, content_type, self.max_chars, {"aggregation": '"simple" or "none"'})
        aggregation = self._aggregation(fields.get("aggregation", params.get("aggregation", ["simple"])[-1]))
        return text, aggregation, self.tokenizer.encode([text])

    @staticmethod
    def _aggregation(value: Any) -> str:
        if value not in AGGREGATIONS:
            raise ClientError(f"aggregation={str(value)[:20]}: must be {' or '.join(AGGREGATIONS)}")
        return str(value)

    def _own_tokens(self, batch: np.ndarray, encoded: Encoded) -> list[np.ndarray]:
        """Each text's own tokens of a padded batch's output (the batch may be padded past the request's longest)."""
        left = self.tokenizer.settings.padding_side == "left"
        return [batch[i, -len(spans) :] if left else batch[i, : len(spans)] for i, spans in enumerate(encoded.spans)]

    def entities(
        self, text: str, spans: list[tuple[int, int] | None], probabilities: np.ndarray, aggregation: str
    ) -> list[dict[str, Any]]:
        """The text's tokens labelled (special tokens left out), then grouped as the pipeline groups them
        (`group_entities`: consecutive tokens of one type, a `B-` starting anew; the score their mean). On the event
        loop for every answer, hence tuples until the answer's own dicts."""
        best, scores = probabilities.argmax(axis=-1).tolist(), probabilities.max(axis=-1).tolist()
        if aggregation == "none":
            return [
                {"entity": label, "score": scores[i], "index": i, "word": text[s:e], "start": s, "end": e}
                for i, span in enumerate(spans)
                if span is not None and (label := self.labels[best[i]]) != IGNORED
                for s, e in [span]
            ]
        groups: list[list[Any]] = []  # [type, start, end, sum of scores, tokens]
        for i, span in enumerate(spans):
            if span is None:
                continue
            prefix, kind = self.tags[best[i]]
            if groups and prefix != "B" and groups[-1][0] == kind:
                group = groups[-1]
                group[2], group[3], group[4] = span[1], group[3] + scores[i], group[4] + 1
            else:
                groups.append([kind, span[0], span[1], scores[i], 1])
        return [
            {"entity_group": kind, "score": total / count, "word": text[start:end], "start": start, "end": end}
            for kind, start, end, total, count in groups
            if kind != IGNORED
        ]

    def protocol_tensors(self) -> tuple[list[ServedTensor], list[ServedTensor]]:
        inputs, outputs = super().protocol_tensors()
        return inputs, [*outputs, ServedTensor("entities", "BYTES", (-1,))]

    async def infer(self, request: InferRequest) -> list[OutputTensor]:
        decoded, encoded = await self.protocol_texts(request)
        outputs = await self.serving.batched(encoded.rows)
        longest = max(len(spans) for spans in encoded.spans)
        logits = np.zeros((len(decoded), longest, len(self.labels)), dtype=np.float32)
        for i, own in enumerate(self._own_tokens(outputs["logits"], encoded)):
            logits[i, : len(own)] = own
        probabilities = self._own_tokens(outputs["probabilities"], encoded)
        found = [
            orjson.dumps(self.entities(text, encoded.spans[i], probabilities[i], "simple"))
            for i, text in enumerate(decoded)
        ]
        return select_outputs(request, {"logits": logits, "entities": np.array(found, dtype=object)}, None)

    def info(self) -> dict[str, Any]:
        return super().info() | {"labels": self.labels, "tokenizer": self.manifest["tokenizer"]}


def _tag(label: str) -> tuple[str, str]:
    """A label's BIO prefix and type, as the pipeline reads them: `B-PER` (B, PER), `I-PER` (I, PER), `X` (I, X)."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label
