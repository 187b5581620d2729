"""A text model's tokenizer as the manifest records it, and the one way texts become the model's inputs: the
export proves its parity with it, and the service tokenizes with it (no transformers, no torch: the `tokenizers`
library and NumPy).

The export writes the training tokenizer's `tokenizer.json` into the folder and `TokenizerSettings` into the
manifest's `tokenizer`: truncation to the model's maximum length, the pad token and side, and the token inputs the
model takes. A batch is padded to its longest text with the pad token's id and a zero attention mask.

A long text is not tokenized whole: the model sees only its first `max_length` tokens, and WordPiece's search is
quadratic in a word's length (100,000 characters of 99-letter words cost ~1 s, security round 4). So a text is
tokenized by prefixes cut at a space, each CHARS_PER_TOKEN x max_length characters and then 4 times longer, until
one gives more tokens than the model takes: a space ends every pre-tokenizer's word (WordPiece's, byte-level BPE's,
SentencePiece's Metaspace), so that prefix's first `max_length` tokens are the whole text's, truncated flag
included, at a cost that follows the tokens the model uses. export/tasks/text_classification.py checks it against
transformers.

A model trained on pairs of texts (`pairs` in the manifest: NLI, a cross-encoder, exported as one) takes only pairs;
a sequence classifier whose tokenizer encodes pairs takes a single text or a pair alike (`takes_pairs`), as
transformers' text-classification pipeline does for any. A pair is `[CLS] a [SEP] b [SEP]`,
truncated as tokenizers' `longest_first` does: the shorter text keeps its tokens up to half the budget, the longer
takes the rest. Prefixes give that exactly while at most one text overflows, or both do and the budget is even;
when both overflow an odd budget, the odd token goes to the text with more tokens in full, which no prefix tells,
so that pair is tokenized whole (HANDOFF_MAX_TEXT_CHARS bounds it).

A tokenizer that cleans texts in Python before its BPE (open_clip's: ftfy's repairs, HTML entities, whitespace,
lower case) names its cleaning in the manifest's `clean` (`CLEANERS`), and the service cleans each text (each prefix
of a long one) the same way before `tokenizers` runs; export/open_clip.py proves the ids equal open_clip's own.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

MASK = "attention_mask"
TOKENIZER_JSON = "tokenizer.json"
ENCODING_FIELDS = {"input_ids": "ids", MASK: "attention_mask", "token_type_ids": "type_ids"}
CHARS_PER_TOKEN = 8  # a first prefix's length, in characters per token the model takes (a token is ~4 in English)


def open_clip_clean(text: str) -> str:
    """What open_clip's SimpleTokenizer does to a text before its BPE: ftfy's repairs (mojibake, ligatures,
    full-width letters), HTML entities unescaped twice, runs of whitespace made one space, lower case."""
    import ftfy  # only open_clip's tokenizer needs it

    repaired = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return re.sub(r"\s+", " ", repaired).strip().lower()


def as_is(text: str) -> str:
    return text


# The manifest's `clean`: what is done to a text before the tokenizer file runs ("" for nothing).
CLEANERS: dict[str, Callable[[str], str]] = {"": as_is, "open_clip": open_clip_clean}


@dataclass(frozen=True)
class TokenizerSettings:
    """The manifest's `tokenizer`: the file and how it was set in training."""

    file: str
    max_length: int
    pad_id: int
    pad_token: str
    padding_side: str  # "right" | "left"
    inputs: tuple[str, ...]  # the model's token inputs, in order: input_ids, attention_mask[, token_type_ids]
    pairs: bool = False  # the model reads pairs of texts (`text`, `text_pair`), never one alone
    takes_pairs: bool = False  # besides single texts, pairs, as transformers' pipeline takes them
    pad_to_max_length: bool = False  # every row padded to max_length, not to the longest (SigLIP's text tower)
    clean: str = ""  # CLEANERS' name of what is done to a text before the tokenizer file (open_clip's)

    @classmethod
    def from_manifest(cls, entry: dict[str, Any]) -> TokenizerSettings:
        return cls(
            entry["file"],
            int(entry["max_length"]),
            int(entry["pad_id"]),
            entry["pad_token"],
            entry["padding_side"],
            tuple(entry["inputs"]),
            bool(entry.get("pairs", False)),
            bool(entry.get("takes_pairs", False)),
            entry.get("padding", "longest") == "max_length",
            str(entry.get("clean", "")),
        )

    def to_manifest(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "max_length": self.max_length,
            "truncation": True,
            "pad_id": self.pad_id,
            "pad_token": self.pad_token,
            "padding_side": self.padding_side,
            "inputs": list(self.inputs),
            "pairs": self.pairs,
            "takes_pairs": self.takes_pairs,
            "padding": "max_length" if self.pad_to_max_length else "longest",
            "clean": self.clean,
        }

    @property
    def any_pairs(self) -> bool:
        """Whether a pair of texts is ever taken (only pairs, or pairs besides single texts)."""
        return self.pairs or self.takes_pairs


@dataclass(frozen=True)
class Encoded:
    """One request's texts as the model's inputs (padded to the longest of them), which were truncated, and where
    each token came from in its text: (start, end) characters, None for a special token ([CLS], [SEP], ...)."""

    rows: dict[str, np.ndarray]
    truncated: list[bool]
    spans: list[list[tuple[int, int] | None]]


class TextTokenizer:
    """The exported tokenizer, truncating to the model's maximum; no padding here (the batch pads)."""

    def __init__(self, tokenizer_json: bytes, settings: TokenizerSettings) -> None:
        from tokenizers import Tokenizer  # only a text model needs it

        if settings.clean not in CLEANERS:
            known = ", ".join(repr(name) for name in CLEANERS)
            raise ValueError(f"the manifest's tokenizer cleans texts by {settings.clean!r}; handoff knows {known}")
        self.settings = settings
        self.clean = CLEANERS[settings.clean]
        self.tokenizer = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(settings.max_length)
        # the same tokenizer untruncated, for the texts of pairs, truncated as a pair (a copy: threads share both)
        self.untruncated = Tokenizer.from_str(tokenizer_json.decode("utf-8")) if settings.any_pairs else None

    def encode(self, texts: list[str]) -> Encoded:
        long = {i: encoding for i, text in enumerate(texts) if (encoding := self._enough_of(text)[1]) is not None}
        short = iter(self.tokenizer.encode_batch([self.clean(text) for i, text in enumerate(texts) if i not in long]))
        return self._encoded([long[i] if i in long else next(short) for i in range(len(texts))])

    def encode_pairs(self, pairs: list[tuple[str, str]]) -> Encoded:
        """Pairs of texts as one model input each, truncated longest-first as transformers does (module docstring).
        Where both texts overflow an odd budget, the odd token goes to the one with more tokens in full (the second
        on a tie, as tokenizers' LongestFirst gives it): each such text's tokens are counted once per call, so a
        query asked against many texts costs its whole length once, not once a text."""
        whole = self.untruncated
        assert whole is not None, "a tokenizer of single texts"
        budget = self.settings.max_length - self.tokenizer.num_special_tokens_to_add(True)
        counted: dict[str, int] = {}

        def count(text: str) -> int:
            if text not in counted:
                counted[text] = len(_encode(whole, self.clean(text), add_special_tokens=False).ids)
            return counted[text]

        encodings, truncated = [], []
        for first, second in pairs:
            (a, a_long), (b, b_long) = self._enough_of(first), self._enough_of(second)
            a_tokens = _encode(whole, self.clean(a), add_special_tokens=False)
            b_tokens = _encode(whole, self.clean(b), add_special_tokens=False)
            if budget % 2 == 1 and a_long is not None and b_long is not None:
                first_share = budget // 2 + (1 if count(first) > count(second) else 0)
                a_tokens.truncate(first_share)
                b_tokens.truncate(budget - first_share)
            joined = self.tokenizer.post_process(a_tokens, b_tokens)
            encodings.append(joined)
            truncated.append(a_long is not None or b_long is not None or bool(joined.overflowing))
        return self._encoded(encodings, truncated)

    def _encoded(self, encodings: list[Any], truncated: list[bool] | None = None) -> Encoded:
        parts = [
            {name: np.asarray([getattr(e, ENCODING_FIELDS[name])], dtype=np.int64) for name in self.settings.inputs}
            for e in encodings
        ]
        spans = [
            [
                None if special else (start, end)
                for (start, end), special in zip(e.offsets, e.special_tokens_mask, strict=True)
            ]
            for e in encodings
        ]
        if truncated is None:
            truncated = [bool(e.overflowing) for e in encodings]
        return Encoded(pad_to_longest(parts, self.settings), truncated, spans)

    def _enough_of(self, text: str) -> tuple[str, Any]:
        """The shortest of `text`'s prefixes (module docstring) whose tokens overflow the model's maximum, and its
        encoding, which truncated is the whole text's; the text itself and None when none does."""
        limit = CHARS_PER_TOKEN * self.settings.max_length
        while (prefix := _cut_at_space(text, limit)) is not None:
            encoding = _encode(self.tokenizer, self.clean(prefix))
            if encoding.overflowing:
                return prefix, encoding
            limit *= 4
        return text, None


def _encode(tokenizer: Any, text: str, add_special_tokens: bool = True) -> Any:
    """One text's encoding. Through `encode_batch`, which lets Python's GIL go while it works, where `encode` holds
    it: a decoder thread tokenizing 30 KB of long words held the event loop 21 ms."""
    return tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0]


def real_tokens(rows: dict[str, np.ndarray]) -> int:
    """How many of a batch's tokens are the texts' own (not padding): the attention mask's ones, or every token of
    a model that takes no mask (open_clip's: its rows padded to the context length)."""
    return int(rows[MASK].sum()) if MASK in rows else int(rows["input_ids"].size)


def pad_to_longest(parts: list[dict[str, np.ndarray]], settings: TokenizerSettings) -> dict[str, np.ndarray]:
    """Token inputs of different lengths as one batch: each padded to the longest (or to the maximum length, where
    the settings say so), on the tokenizer's side."""
    longest = settings.max_length if settings.pad_to_max_length else max(p[MASK].shape[1] for p in parts)
    joined = {}
    for name in settings.inputs:
        fill = settings.pad_id if name == "input_ids" else 0
        padded = [_pad(p[name], longest, fill, settings.padding_side) for p in parts]
        joined[name] = np.concatenate(padded) if len(padded) > 1 else padded[0]
    return joined


def _pad(array: np.ndarray, length: int, fill: int, side: str) -> np.ndarray:
    missing = length - array.shape[1]
    if missing == 0:
        return array
    pad = np.full((array.shape[0], missing), fill, dtype=array.dtype)
    return np.concatenate([array, pad] if side == "right" else [pad, array], axis=1)


def _cut_at_space(text: str, limit: int) -> str | None:
    """`text` up to the last space before `limit` characters (None: none there, or the text is shorter)."""
    if len(text) <= limit:
        return None
    cut = max(text.rfind(" ", 0, limit), text.rfind("\n", 0, limit))
    return text[:cut] if cut > 0 else None
