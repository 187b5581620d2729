"""What the tasks that take texts share (`TextTask`): the tokenizer from the export's verified bytes, the bound on a
text, the protocol's BYTES texts (and a pair model's `text_pair`) checked and tokenized, and the batch shape that
lets texts of any length share a call, padded (`PaddedSequences`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import orjson

from contract.errors import ClientError
from contract.manifest import read_artifact
from contract.tokenizer_spec import Encoded, TextTokenizer, TokenizerSettings, pad_to_longest, real_tokens
from serve.model.tensor_inputs import check_rows
from serve.protocols.oip_codec import InferRequest
from serve.protocols.tensors import TEXT_INPUT, TEXT_PAIR_INPUT, ServedTensor
from serve.tasks.base import ProtocolTask, Serving

IDS = "input_ids"  # every text model takes them; the attention mask, not every one (open_clip's)

T = TypeVar("T")

TEXT_TYPES = ("application/json", "text/plain")  # the bodies a text is sent in


def text_bodies(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The OpenAPI bodies of a route that takes one text: a JSON object (`schema`) or the text as text/plain."""
    return {"application/json": {"schema": schema}, "text/plain": {"schema": {"type": "string"}}}


PADDED_SHARE = 0.25  # a call's padding at most a quarter of its real tokens
INLINE_TEXT_BYTES = 1024
"""a request body up to this size is read and tokenized on the event loop: ~0.07 ms for a text of 64 words, ~0.6 ms
for the costliest kilobyte tried (punctuation, a token a character), where the hop to a decoder thread costs ~0.1 ms
of CPU itself; a longer one goes to a decoder thread"""


class PaddedSequences:
    """serve/model/batch_shape.py's batch shape for token inputs: any lengths share a batch, padded to the longest (the
    pad token's id, a zero mask), up to `max_tokens` padded tokens in all."""

    def __init__(self, settings: TokenizerSettings, max_tokens: int | None = None) -> None:
        self.settings = settings
        self.max_tokens = max_tokens

    def key(self, rows: Any) -> tuple:
        return ()

    def join(self, parts: list[Any]) -> dict[str, np.ndarray]:
        return pad_to_longest(parts, self.settings)

    def fits(self, parts: list[Any], more: Any) -> bool:
        if self.max_tokens is None:
            return True
        rows = sum(p[IDS].shape[0] for p in parts) + more[IDS].shape[0]
        longest = max(more[IDS].shape[1], *(p[IDS].shape[1] for p in parts))
        return rows * longest <= self.max_tokens

    def groups(self, parts: list[Any]) -> list[list[int]]:
        """The batch sorted by length and cut where padding would pass PADDED_SHARE of a call's tokens: a 10-token
        text padded to 80 costs the model what an 80-token one does (attention more), so mixed lengths in one call
        cost up to twice their tokens (bench/text_serving.py: 0.49 x the limit at c=64 in one call, see
        docs/text.md)."""
        order = sorted(range(len(parts)), key=lambda i: parts[i][IDS].shape[1])
        groups: list[list[int]] = []
        tokens = rows = 0
        for i in order:
            part_rows, length = parts[i][IDS].shape
            real = real_tokens(parts[i])
            if not groups or (rows + part_rows) * length > (1 + PADDED_SHARE) * (tokens + real):
                groups.append([])
                tokens = rows = 0
            groups[-1].append(i)
            tokens += real
            rows += part_rows
        return groups


def checked_text(text: Any, max_chars: int, what: str) -> str:
    if not isinstance(text, str):
        raise ClientError(f"{what} must be a string, not {type(text).__name__}")
    if not text.strip():
        raise ClientError(f"{what} is empty: send the text to classify")
    if len(text) > max_chars:
        raise ClientError(f"{what} holds {len(text)} characters; at most {max_chars} (HANDOFF_MAX_TEXT_CHARS)", 413)
    return text


def texts_of_elements(elements: list[bytes], max_chars: int, name: str = TEXT_INPUT) -> list[str]:
    """The protocol's BYTES elements of input `name` as texts: each UTF-8, not empty, not too long."""
    texts = []
    for index, element in enumerate(elements):
        try:
            text = element.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ClientError(f"{name}[{index}] is not valid UTF-8 (byte {err.start})") from None
        texts.append(checked_text(text, max_chars, f"{name}[{index}]"))
    return texts


def text_of_body(body: bytes, content_type: str, max_chars: int, options: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """A text route's body: a JSON `{"text": "...", option: example, ...}` (each of `options` optional) or the text
    itself as text/plain; and the JSON's other fields. ClientError (400) for anything else."""
    if content_type == "text/plain":
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ClientError(f"the body is not valid UTF-8 (byte {err.start})") from None
        return checked_text(text, max_chars, "the body"), {}
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise ClientError(f"the body is not valid JSON ({str(err)[:120]})") from None
    if not isinstance(document, dict) or "text" not in document or set(document) - {"text", *options}:
        shown = "".join(f', "{name}": {example}' for name, example in options.items())
        raise ClientError(f'expected a JSON object {{"text": "..."{shown}}}, {" and ".join(options)} optional')
    return checked_text(document["text"], max_chars, '"text"'), {k: v for k, v in document.items() if k != "text"}


class TextTask(ProtocolTask):
    """A task whose requests are texts: its tokenizer (the `tokenizers` library, no transformers, no torch), loaded
    from the bytes the manifest vouches for, truncating as it did in training; texts of any length share a call."""

    def __init__(self, serving: Serving) -> None:
        super().__init__(serving)
        settings = TokenizerSettings.from_manifest(self.manifest["tokenizer"])
        tokenizer_json = read_artifact(serving.folder, self.manifest, self.manifest["tokenizer"]["file"])
        self.tokenizer = TextTokenizer(tokenizer_json, settings)
        self.max_chars = self.config.max_text_chars
        self.batch_shape = PaddedSequences(settings, max(self.config.max_batch_tokens, settings.max_length))

    def protocol_tensors(self) -> tuple[list[ServedTensor], list[ServedTensor]]:
        """Texts in (tokenized by the service; a pair model's second texts beside them), the signature's outputs
        out."""
        _, outputs = super().protocol_tensors()
        return [ServedTensor(name, "BYTES", (-1,)) for name in self.text_inputs], outputs

    @property
    def text_inputs(self) -> tuple[str, ...]:
        return (TEXT_INPUT, TEXT_PAIR_INPUT) if self.tokenizer.settings.any_pairs else (TEXT_INPUT,)

    async def protocol_texts(self, request: InferRequest) -> tuple[list[str], Encoded]:
        """The protocol's `text` input (BYTES [N] or [N, 1]; `text_pair` beside it, a pair per row, for a model that
        takes pairs: always where it takes only pairs), each text checked, and all tokenized (`tokenized`)."""
        names = self.text_inputs
        settings = self.tokenizer.settings
        if settings.takes_pairs and set(request.inputs) == {TEXT_INPUT}:
            names = (TEXT_INPUT,)  # single texts, which this model takes besides pairs
        if set(request.inputs) != set(names):
            wanted = " and ".join(f"'{name}'" for name in names)
            given = ", ".join(sorted(request.inputs))
            raise ClientError(
                f"send {'one input' if len(names) == 1 else 'two inputs'}, {wanted} (BYTES [N]: UTF-8 texts"
                f"{'; row i of each is pair i' if len(names) > 1 else ''}"
                f"{f'; or {TEXT_INPUT!r} alone' if settings.takes_pairs else ''}); got {given}"
            )
        columns = []
        for name in names:
            texts = request.inputs[name]
            if texts.datatype != "BYTES" or len(texts.shape) not in (1, 2) or texts.shape[1:] not in ((), (1,)):
                raise ClientError(
                    f"input '{name}' must be BYTES of shape [N] or [N, 1], got {texts.datatype} {list(texts.shape)}"
                )
            columns.append(texts.value)
        if len({len(column) for column in columns}) > 1:
            raise ClientError(f"'{TEXT_INPUT}' and '{TEXT_PAIR_INPUT}' must hold as many texts: one pair per row")
        check_rows(len(columns[0]), self.config.max_batch_size)
        return await self.tokenized(sum(len(text) for column in columns for text in column), self._tokenized, columns)

    async def tokenized(self, size: int, work: Callable[..., T], *args: object) -> T:
        """`work(*args)`, which reads and tokenizes `size` bytes of text: on the event loop where that is
        small (INLINE_TEXT_BYTES), else in a decoder thread."""
        return await self.serving.decoders.run(work, *args, inline=size <= INLINE_TEXT_BYTES)

    def _tokenized(self, columns: list[list[bytes]]) -> tuple[list[str], Encoded]:
        decoded = [
            texts_of_elements(c, self.max_chars, name) for c, name in zip(columns, (TEXT_INPUT, TEXT_PAIR_INPUT))
        ]
        if len(decoded) == 2:
            return decoded[0], self.tokenizer.encode_pairs(list(zip(*decoded, strict=True)))
        return decoded[0], self.tokenizer.encode(self.prepared(decoded[0]))

    def prepared(self, texts: list[str]) -> list[str]:
        """The texts as the model's library makes them before tokenizing (a sentence encoder's default prompt put
        before each); as given by default."""
        return texts
