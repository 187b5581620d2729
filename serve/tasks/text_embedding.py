"""A sentence encoder's serving side: texts in, one vector each out, pooled (and normalised) inside the graph
(export/tasks/text_embedding.py).

- POST /embed, as text-embeddings-inference answers it: `{"inputs": "text" | ["text", ...], "normalize": true,
  "truncate": false, "prompt_name": null}` -> `[[...], ...]`, one vector per text. A text longer than the model's
  maximum (its prompt included) is refused (413) unless `truncate` is true, as there; `normalize` (true by default)
  scales each vector to unit length where the model does not already;
- POST /v1/embeddings, as OpenAI's embeddings API answers it: `{"input": "text" | ["text", ...], "model": ...,
  "encoding_format": "float" | "base64", "prompt_name": null}` -> `{"object": "list", "data": [{"object":
  "embedding", "index", "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}`, unit vectors, texts
  truncated;
- POST /predict: token ids by name, as any model's inputs;
- the protocol: `text` (BYTES [N]: UTF-8 texts) in, `embeddings` (FP32 [N, D]) out.

A sentence-transformers folder's prompts (contract/prompts.py) are applied as its `encode` applies them: the default
prompt before every text unless `prompt_name` names another (TEI's field; "" where the folder has a prompt of no text).

A request's texts are tokenized together (in a decoding thread unless short: TextTask.tokenized) and share the
model's call with other requests' (`PaddedSequences`: any lengths, padded; the export proved padding changes no vector).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from contract.errors import ClientError
from contract.prompts import Prompts
from contract.signature import TASK_TEXT_EMBEDDING
from contract.tokenizer_spec import Encoded, real_tokens
from serve.http.endpoint import Answer, Endpoint, Incoming
from serve.http.json_body import parse_json
from serve.model.tensor_inputs import check_rows
from serve.protocols.oip_codec import InferRequest, OutputTensor
from serve.protocols.tensors import select_outputs
from serve.tasks.base import Serving, json_route, only_params
from serve.tasks.texts import TextTask, checked_text

ENCODINGS = ("float", "base64")
VECTORS = {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}
PROMPT_NAME = {"type": ["string", "null"], "description": "one of the model's prompts (/info); none: its default"}
TEXTS = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]}


class TextEmbedding(TextTask):
    name = TASK_TEXT_EMBEDDING
    kind = "a sentence encoder"

    def __init__(self, serving: Serving) -> None:
        super().__init__(serving)
        self.embedding: dict[str, Any] = self.manifest["embedding"]
        self.prompts = Prompts.read(self.embedding, "the manifest's embedding")

    def endpoints(self) -> list[Endpoint]:
        embed = {
            "type": "object",
            "properties": {
                "inputs": TEXTS,
                "normalize": {"type": "boolean"},
                "truncate": {"type": "boolean"},
                "prompt_name": PROMPT_NAME,
            },
            "required": ["inputs"],
            "additionalProperties": False,
        }
        openai = {
            "type": "object",
            "properties": {
                "input": TEXTS,
                "model": {"type": "string"},
                "encoding_format": {"enum": list(ENCODINGS)},
                "dimensions": {"type": "integer"},
                "user": {"type": "string"},
                "prompt_name": PROMPT_NAME,
            },
            "required": ["input"],
            "additionalProperties": False,
        }
        item = {
            "type": "object",
            "properties": {"object": {"type": "string"}, "index": {"type": "integer"}, "embedding": {}},
        }
        listed = {
            "type": "object",
            "properties": {"object": {"type": "string"}, "data": {"type": "array", "items": item}},
        }
        return [
            json_route(
                "/embed",
                "a sentence encoder's vectors, as text-embeddings-inference answers: "
                '{"inputs": text or [texts], "normalize": true, "truncate": false} -> [[...], ...]',
                self.embed,
                embed,
                VECTORS,
            ),
            json_route(
                "/v1/embeddings",
                "a sentence encoder's vectors, as OpenAI's embeddings API answers: "
                '{"input": text or [texts], "model": ...} -> {"object": "list", "data": [...], "usage": ...}',
                self.openai_embeddings,
                openai,
                listed,
            ),
            self.predict_route(),
        ]

    async def embed(self, request: Incoming) -> Answer:
        """POST /embed: text-embeddings-inference's request and answer."""
        _, vectors, _ = await self._vectors(request, self._embed_request)
        return Answer(orjson.dumps(np.ascontiguousarray(vectors, dtype=np.float32), option=orjson.OPT_SERIALIZE_NUMPY))

    async def openai_embeddings(self, request: Incoming) -> Answer:
        """POST /v1/embeddings: OpenAI's request and answer."""
        options, vectors, encoded = await self._vectors(request, self._openai_request)
        return Answer(self._openai_answer(vectors, encoded, options["encoding_format"], options["model"]))

    async def _vectors(
        self, request: Incoming, parse: Callable[[bytes], tuple[list[str], dict[str, Any]]]
    ) -> tuple[dict[str, Any], np.ndarray, Encoded]:
        """The request's options (read by `parse`), its texts' vectors (normalized where asked) and their tokens."""
        only_params(request.params, set())
        options, encoded = await self.tokenized(len(request.body), self._encode_request, parse, request.body)
        if not options["truncate"] and any(encoded.truncated):
            first = encoded.truncated.index(True)
            raise ClientError(
                f"text {first} has more tokens than the model's {self.tokenizer.settings.max_length}; send "
                '"truncate": true to embed its beginning',
                413,
            )
        vectors = (await self.serving.batched(encoded.rows))["embeddings"]
        if options["normalize"] and not self.embedding["normalized"]:
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return options, vectors, encoded

    def _encode_request(
        self, parse: Callable[[bytes], tuple[list[str], dict[str, Any]]], body: bytes
    ) -> tuple[dict[str, Any], Encoded]:
        """The body's options and its texts' tokens (TextTask.tokenized says where)."""
        texts, options = parse(body)
        prefix = self.prompts.prefix(options["prompt_name"])
        return options, self.tokenizer.encode([prefix + text for text in texts])

    def prepared(self, texts: list[str]) -> list[str]:
        prefix = self.prompts.prefix(None)
        return [prefix + text for text in texts]

    def _texts(self, value: Any, field: str) -> list[str]:
        """A text or a list of texts (1 to HANDOFF_MAX_BATCH_SIZE), each checked as /classify checks one."""
        texts = [value] if isinstance(value, str) else value
        if not isinstance(texts, list) or not texts:
            raise ClientError(f'"{field}" must be a text or a list of texts')
        check_rows(len(texts), self.config.max_batch_size)
        return [checked_text(text, self.max_chars, f"{field}[{i}]") for i, text in enumerate(texts)]

    def _embed_request(self, body: bytes) -> tuple[list[str], dict[str, Any]]:
        document = parse_json(body)
        if not isinstance(document, dict) or "inputs" not in document:
            raise ClientError('expected a JSON object {"inputs": "text" or ["text", ...]}')
        unknown = sorted(set(document) - {"inputs", "normalize", "truncate", "prompt_name"})
        if unknown:
            raise ClientError(
                f"unknown field(s) {', '.join(unknown)}; /embed takes inputs, normalize, truncate, prompt_name"
            )
        options = {"normalize": document.get("normalize", True), "truncate": document.get("truncate", False)}
        if not all(isinstance(value, bool) for value in options.values()):
            raise ClientError('"normalize" and "truncate" must be true or false')
        return self._texts(document["inputs"], "inputs"), options | {"prompt_name": _prompt_name(document)}

    def _openai_request(self, body: bytes) -> tuple[list[str], dict[str, Any]]:
        document = parse_json(body)
        if not isinstance(document, dict) or "input" not in document:
            raise ClientError('expected a JSON object {"input": "text" or ["text", ...], "model": "..."}')
        unknown = sorted(set(document) - {"input", "model", "encoding_format", "dimensions", "user", "prompt_name"})
        if unknown:
            raise ClientError(f"unknown field(s) {', '.join(unknown)}; /v1/embeddings takes input, model, ...")
        encoding = document.get("encoding_format", "float")
        if encoding not in ENCODINGS:
            raise ClientError(f"encoding_format must be {' or '.join(ENCODINGS)}")
        dimensions = document.get("dimensions", self.embedding["dimensions"])
        if dimensions != self.embedding["dimensions"]:
            raise ClientError(f"dimensions: this model's vectors have {self.embedding['dimensions']}, no other")
        model = document.get("model", self.config.model_name)
        if not isinstance(model, str):
            raise ClientError('"model" must be a string')
        if model != self.config.model_name:  # as the chat routes and vLLM answer a model they do not serve
            raise ClientError(
                f"The model `{model[:100]}` does not exist; this server serves `{self.config.model_name}`", 404
            )
        options = {"normalize": True, "truncate": True, "encoding_format": encoding, "model": model[:200]}
        return self._texts(document["input"], "input"), options | {"prompt_name": _prompt_name(document)}

    @staticmethod
    def _openai_answer(vectors: np.ndarray, encoded: Encoded, encoding: str, model: str) -> dict[str, Any]:
        tokens = real_tokens(encoded.rows)
        rows = np.ascontiguousarray(vectors, dtype="<f4")
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(row.tobytes()).decode() if encoding == "base64" else row.tolist(),
            }
            for i, row in enumerate(rows)
        ]
        return {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    async def infer(self, request: InferRequest) -> list[OutputTensor]:
        _, encoded = await self.protocol_texts(request)
        return select_outputs(request, await self.serving.batched(encoded.rows), None)

    def info(self) -> dict[str, Any]:
        return super().info() | {"embedding": self.embedding, "tokenizer": self.manifest["tokenizer"]}


def _prompt_name(document: dict[str, Any]) -> str | None:
    name = document.get("prompt_name")
    if name is not None and not isinstance(name, str):
        raise ClientError('"prompt_name" must be the name of one of the model\'s prompts, or null')
    return name
