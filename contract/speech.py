"""A Whisper model's decoding, torch-free, as transformers' `generate` does it with the folder's generation config:
the manifest's `speech` settings, the decoder's prompt, and greedy (or sampled) decoding over the two exported towers.

The prompt is Whisper's: `<|startofprev|>` and a previous text's tokens where a prompt is given, then
`<|startoftranscript|>`, the language's token (the request's, else the generation config's, else the one the
model finds likeliest after `<|startoftranscript|>`, as `generate` detects it), the task's (`transcribe` or
`translate`) and `<|notimestamps|>`. Each step's logits have the config's `suppress_tokens` removed, and at the first
generated step its `begin_suppress_tokens` too; decoding ends at the end token or where the sequence reaches
`generate`'s length: the config's `max_length` plus the prompt's tokens (at most half the decoder's positions), never
past the decoder's positions. (`generate` reads any token past <|notimestamps|> as a timestamp, even when told
<|notimestamps|>, and then decodes the rest of the window again; handoff decodes one window, and its export refuses a
model whose `generate` did so on its clips.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from contract.errors import ClientError

TASKS = ("transcribe", "translate")
Decoder = Callable[[np.ndarray], np.ndarray]  # token ids (rows x tokens) -> logits (rows x tokens x vocabulary)


@dataclass(frozen=True)
class SpeechSettings:
    """The manifest's `speech`: the generation config's settings the service decodes with."""

    start: int  # <|startoftranscript|>: the decoder's start token
    end: int  # <|endoftext|>
    max_length: int  # the generation config's, the prompt's tokens excluded
    positions: int  # the decoder's positions (max_target_positions)
    languages: dict[str, int]  # a language's code ("en") -> its token's id
    names: dict[str, str]  # a language's name ("english") -> its code
    tasks: dict[str, int]  # transcribe, translate -> their tokens' ids
    no_timestamps: int | None
    previous: int | None  # <|startofprev|>, before a prompt's tokens
    suppress: tuple[int, ...] = ()
    begin_suppress: tuple[int, ...] = ()
    language: str | None = None  # the generation config's, a code; None: detected
    task: str = "transcribe"
    window_seconds: float = 30.0  # the feature extractor's window: one clip at most this long
    special: tuple[int, ...] = field(default=())  # every special token, left out of the text

    def text_tokens(self, tokens: list[int]) -> list[int]:
        """The tokens a text is decoded from: timestamps (every id after <|notimestamps|>) left out, as Whisper's
        tokenizer leaves them out of its text."""
        return [t for t in tokens if self.no_timestamps is None or t <= self.no_timestamps]

    def to_manifest(self) -> dict[str, Any]:
        return {**asdict(self), "suppress": list(self.suppress), "begin_suppress": list(self.begin_suppress)}

    @classmethod
    def from_manifest(cls, fields: dict[str, Any]) -> SpeechSettings:
        given = dict(fields)
        for name in ("suppress", "begin_suppress", "special"):
            given[name] = tuple(int(i) for i in given.get(name, ()))
        return cls(**given)

    def code_of(self, language: str) -> str:
        """A request's `language` (a code, as OpenAI's API takes it, or a name) as the model's code; ClientError for
        one the model has no token for."""
        wanted = language.strip().lower()
        code = self.names.get(wanted, wanted)
        if code not in self.languages:
            known = ", ".join(sorted(self.languages)[:20])
            raise ClientError(f"language {language[:40]!r}: this model knows {known}")
        return code

    def prompt(self, language: str | None, task: str, previous: list[int] | None) -> list[int]:
        """The decoder's first tokens, without the language where it is to be detected (language None and none in
        the generation config, for a model that knows several)."""
        ids = [self.previous, *previous] if previous and self.previous is not None else []
        ids.append(self.start)
        code = language or self.language
        if self.languages and (code is not None or len(self.languages) == 1):
            ids.append(self.languages[code or next(iter(self.languages))])
        if self.tasks:
            ids.append(self.tasks[task])
        if self.no_timestamps is not None:
            ids.append(self.no_timestamps)
        return ids

    def detect_language(self, decoder: Decoder, prefix: list[int]) -> int:
        """The language token the model finds likeliest right after `<|startoftranscript|>`, as `generate` detects
        it where no language is given."""
        logits = decoder(np.asarray([prefix], dtype=np.int64))[0, -1]
        ids = np.asarray(list(self.languages.values()))
        return int(ids[int(np.argmax(logits[ids]))])

    def with_language(self, decoder: Decoder, prompt: list[int], task: str) -> list[int]:
        """`prompt` with its language token, detected where it has none."""
        if not self.languages or any(token in self.languages.values() for token in prompt):
            return prompt
        at = prompt.index(self.start) + 1
        return [*prompt[:at], self.detect_language(decoder, prompt[:at]), *prompt[at:]]

    def length(self, prompt_tokens: int) -> int:
        """The sequence's length at which `generate` stops, its prompt included."""
        initial = min(self.positions // 2 - 1, prompt_tokens)
        return min(self.max_length + initial, self.positions)

    def decode(
        self, decoder: Decoder, prompt: list[int], rows: int, temperature: float = 0.0, seed: int = 0
    ) -> tuple[list[list[int]], list[list[np.ndarray]]]:
        """Each row's generated tokens (the end token left out) and its logits at each step, as processed:
        greedy with `temperature` 0, else sampled from the processed logits divided by it."""
        sequences = np.tile(np.asarray(prompt, dtype=np.int64), (rows, 1))
        done = np.zeros(rows, dtype=bool)
        tokens: list[list[int]] = [[] for _ in range(rows)]
        steps: list[list[np.ndarray]] = [[] for _ in range(rows)]
        random = np.random.default_rng(seed)
        first = True
        while sequences.shape[1] < self.length(len(prompt)) and not done.all():
            logits = decoder(sequences)[:, -1].astype(np.float64)
            logits[:, list(self.suppress)] = -np.inf
            if first and self.begin_suppress:
                logits[:, list(self.begin_suppress)] = -np.inf
            first = False
            chosen = np.argmax(logits, axis=1) if temperature == 0 else _sampled(logits, temperature, random)
            chosen = np.where(done, self.end, chosen)
            for row in np.flatnonzero(~done):
                steps[row].append(logits[row])
                if chosen[row] != self.end:
                    tokens[row].append(int(chosen[row]))
            done |= chosen == self.end
            sequences = np.concatenate([sequences, chosen[:, None]], axis=1)
        return tokens, steps


def _sampled(logits: np.ndarray, temperature: float, random: np.random.Generator) -> np.ndarray:
    scaled = logits / temperature
    scaled -= scaled.max(axis=1, keepdims=True)
    weights = np.exp(scaled)
    weights /= weights.sum(axis=1, keepdims=True)
    return np.asarray([random.choice(len(row), p=row) for row in weights])
