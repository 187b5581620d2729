"""A cross-encoder's serving side: a one-logit sequence classifier trained on pairs (a reranker), its logit the
relevance of a text to a query. Everything else is a text classifier's (serve/tasks/text_classification.py).

- POST /rerank, as text-embeddings-inference answers it: `{"query": "...", "texts": ["...", ...], "raw_scores":
  false, "return_text": false, "truncate": false}` -> `[{"index": i, "score": s}, ...]`, best first; the score is
  the logit's sigmoid (the logit itself with `raw_scores`). A pair past the model's maximum is refused (413) unless
  `truncate` is true, as there;
- POST /classify: `{"text": "...", "text_pair": "..."}` -> the model's one label, scored as transformers'
  pipeline scores it (the manifest's `scores`: the sigmoid, or the logit itself for a regression head);
- POST /predict and the protocol (`text` and `text_pair` in, `logits` and `probabilities` out), as a text
  classifier's.

A request's pairs are tokenized together (in a decoding thread unless short: TextTask.tokenized) and share the
model's call with other requests'.
"""

from __future__ import annotations

import orjson

from contract.errors import ClientError
from contract.scores import SCORE_FUNCTIONS
from contract.signature import TASK_TEXT_RANKING
from contract.tokenizer_spec import Encoded
from serve.http.endpoint import Answer, Endpoint, Incoming
from serve.http.json_body import parse_json
from serve.model.tensor_inputs import check_rows
from serve.tasks.base import json_route, only_params
from serve.tasks.text_classification import TextClassification
from serve.tasks.texts import checked_text

RERANK_OPTIONS = ("raw_scores", "return_text", "truncate")


class TextRanking(TextClassification):
    name = TASK_TEXT_RANKING
    kind = "a cross-encoder"

    @property
    def rerank_scores(self) -> str:
        """How /rerank scores a logit: as the folder's CrossEncoder does (its activation; the sigmoid by default)."""
        return str(self.manifest.get("rerank_scores", "sigmoid"))

    async def rerank(self, request: Incoming) -> Answer:
        """POST /rerank: text-embeddings-inference's request and answer."""
        only_params(request.params, set())
        options, texts, encoded = await self.tokenized(len(request.body), self._rerank_request, request.body)
        if not options["truncate"] and any(encoded.truncated):
            first = encoded.truncated.index(True)
            raise ClientError(
                f"the query with texts[{first}] has more tokens than the model's "
                f'{self.tokenizer.settings.max_length}; send "truncate": true to rank their beginnings',
                413,
            )
        outputs = await self.serving.batched(encoded.rows)
        logits = outputs["logits"][:, 0]
        scores = (logits if options["raw_scores"] else SCORE_FUNCTIONS[self.rerank_scores](logits)).tolist()
        order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable: equal scores in the texts' order
        ranks = [
            {"index": i, "score": scores[i], **({"text": texts[i]} if options["return_text"] else {})} for i in order
        ]
        return Answer(orjson.dumps(ranks))

    def _rerank_request(self, body: bytes) -> tuple[dict[str, bool], list[str], Encoded]:
        """/rerank's options, its texts and the (query, text) pairs' tokens."""
        document = parse_json(body)
        if not isinstance(document, dict) or "query" not in document or "texts" not in document:
            raise ClientError('expected a JSON object {"query": "...", "texts": ["...", ...]}')
        unknown = sorted(set(document) - {"query", "texts", *RERANK_OPTIONS})
        if unknown:
            raise ClientError(
                f"unknown field(s) {', '.join(unknown)}; /rerank takes query, texts, {', '.join(RERANK_OPTIONS)}"
            )
        options = {name: document.get(name, False) for name in RERANK_OPTIONS}
        if not all(isinstance(value, bool) for value in options.values()):
            raise ClientError(f"{', '.join(RERANK_OPTIONS)} must be true or false")
        query = checked_text(document["query"], self.max_chars, '"query"')
        texts = document["texts"]
        if not isinstance(texts, list) or not texts:
            raise ClientError('"texts" must be a list of texts, at least one')
        check_rows(len(texts), self.config.max_batch_size)
        texts = [checked_text(text, self.max_chars, f"texts[{i}]") for i, text in enumerate(texts)]
        return options, texts, self.tokenizer.encode_pairs([(query, text) for text in texts])

    def endpoints(self) -> list[Endpoint]:
        rerank = {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "texts": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                **{name: {"type": "boolean", "default": False} for name in RERANK_OPTIONS},
            },
            "required": ["query", "texts"],
            "additionalProperties": False,
        }
        rank = {
            "type": "object",
            "properties": {"index": {"type": "integer"}, "score": {"type": "number"}, "text": {"type": "string"}},
            "required": ["index", "score"],
        }
        ranks = {"type": "array", "items": rank}
        own = json_route(
            "/rerank",
            "a cross-encoder's texts ranked by their relevance to a query, as text-embeddings-inference answers: "
            '{"query": ..., "texts": [...], "raw_scores": false, "return_text": false, "truncate": false} -> '
            '[{"index": i, "score": s}, ...], best first',
            self.rerank,
            rerank,
            ranks,
        )
        return [own, *super().endpoints()]
