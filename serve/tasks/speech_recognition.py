"""A fine-tuned Whisper served as OpenAI's audio API serves speech recognition, from its two towers
(serve/model/towers.py: the encoder, and the decoder run once a token) and contract/speech.py's decoding.

- POST /v1/audio/transcriptions: a multipart form, as OpenAI's SDK sends it: `file` (any container contract/audio.py
  decodes), `model` (this service's name), `language` (a code such as `en`, or a name; else the generation config's,
  else detected), `prompt` (earlier text, Whisper's previous-text prompt), `response_format` (`json`, `text`, `srt`,
  `vtt`, `verbose_json` with its segment) and `temperature` (0, the default: greedy, as the export proved; above
  0: sampled, which no parity covers) -> `{"text": ...}`, the text without Whisper's leading space, as OpenAI's;
- POST /v1/audio/translations: the same, translated into English (Whisper's `translate` task), without `language`.
Errors come in OpenAI's error body. A clip is at most the model's window (30 s): longer audio is refused with that
bound (long-form transcription, windows joined as transformers' pipeline joins them, is not served yet).

Requests with the same prompt and temperature share the encoder's call and the decoding loop; a request whose
language is to be detected is decoded with the language each clip's detection finds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson

from contract.audio import decode_audio
from contract.audio_features import FEATURE_TABLES, AudioFeatures
from contract.errors import ClientError
from contract.manifest import Manifest, read_artifact
from contract.signature import TASK_SPEECH_RECOGNITION
from contract.speech import SpeechSettings
from serve.config import ServeConfig
from serve.http.endpoint import Answer, Endpoint, Incoming
from serve.model.lanes import Lanes
from serve.model.runtime import Runtime
from serve.model.towers import Towers
from serve.protocols.openai_api import ERROR_SCHEMA, error_body
from serve.tasks.audio import audio_route
from serve.tasks.base import ServedTask, Serving, one_param, only_params

FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
TRANSCRIBE_FIELDS = {
    "file": "file",
    "model": "text",
    "language": "text",
    "prompt": "text",
    "response_format": "text",
    "temperature": "text",
}
TRANSLATE_FIELDS = {name: kind for name, kind in TRANSCRIBE_FIELDS.items() if name != "language"}
MAX_PROMPT_CHARS = 2000
JSON_ANSWER = ("application/json", {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})


class SamePrompt:
    """serve/model/batch_shape.py's batch shape for Whisper: clips share a call when their prompts and temperatures
    are the same (the features are all one shape)."""

    def key(self, rows: Any) -> tuple:
        return (tuple(rows["prompt"][0].tolist()), float(rows["temperature"][0]))

    def join(self, parts: list[Any]) -> Any:
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}

    def fits(self, parts: list[Any], more: Any) -> bool:
        return True

    def groups(self, parts: list[Any]) -> list[list[int]]:
        return [list(range(len(parts)))]


class SpeechRecognition(ServedTask):
    name = TASK_SPEECH_RECOGNITION
    kind = "a speech recognizer"

    @classmethod
    def own_runtime(cls, config: ServeConfig, folder: Path, manifest: Manifest) -> tuple[Lanes, Runtime]:
        return Towers.arranged(config, folder, manifest, "the encoder once a call, the decoder once a token")

    def __init__(self, serving: Serving) -> None:
        super().__init__(serving)
        from tokenizers import Tokenizer  # a text model's dependency, not torch's

        tables = read_artifact(serving.folder, self.manifest, FEATURE_TABLES)
        self.features = AudioFeatures.from_manifest(self.manifest["audio"], tables)
        self.settings = SpeechSettings.from_manifest(self.manifest["speech"])
        self.tokenizer = Tokenizer.from_str(
            read_artifact(serving.folder, self.manifest, self.manifest["tokenizer"]["file"]).decode("utf-8")
        )
        self.batch_shape = SamePrompt()

    def endpoints(self) -> list[Endpoint]:
        format_query = ({"name": "response_format", "in": "query", "required": False, "schema": {"enum": FORMATS}},)
        routes = (
            (
                "/v1/audio/transcriptions",
                "an audio file's text, as OpenAI's transcriptions API answers: a multipart form with `file`, "
                "`model`, `language`, `prompt`, `response_format` and `temperature`",
                self.transcribe,
                TRANSCRIBE_FIELDS,
            ),
            (
                "/v1/audio/translations",
                "an audio file's text in English, as OpenAI's translations API answers",
                self.translate,
                TRANSLATE_FIELDS,
            ),
        )
        return [
            audio_route(path, summary, handler, JSON_ANSWER, fields, format_query, error_body, ERROR_SCHEMA)
            for path, summary, handler, fields in routes
        ]

    async def transcribe(self, request: Incoming) -> Answer:
        return await self._answer(request, "transcribe")

    async def translate(self, request: Incoming) -> Answer:
        if "translate" not in self.settings.tasks:
            raise ClientError("this model has no translate task (its generation config's task_to_id)")
        return await self._answer(request, "translate")

    async def _answer(self, request: Incoming, task: str) -> Answer:
        allowed = set(TRANSCRIBE_FIELDS if task == "transcribe" else TRANSLATE_FIELDS) - {"file"}
        only_params(request.params, allowed)
        model = one_param(request.params, "model", self.config.model_name)
        if model != self.config.model_name:  # as the chat routes, and vLLM, answer a model they do not serve
            raise ClientError(
                f"The model `{model[:100]}` does not exist; this server serves `{self.config.model_name}`", 404
            )
        response_format = one_param(request.params, "response_format", "json")
        if response_format not in FORMATS:
            raise ClientError(f"response_format {response_format[:20]!r}: one of {', '.join(FORMATS)}")
        temperature = _temperature(one_param(request.params, "temperature", "0"))
        language = one_param(request.params, "language", "").strip()
        code = self.settings.code_of(language) if language else None
        prompt = self._prompt(one_param(request.params, "prompt", ""), code, task)
        features, seconds = await self.serving.decoders.run(self._features, request.body)
        rows = {
            "input_features": features[None],
            "prompt": np.asarray([prompt], dtype=np.int64),
            "temperature": np.asarray([temperature], dtype=np.float32),
        }
        outputs = await self.serving.batched(rows)
        tokens = [int(t) for t in outputs["tokens"][0] if t >= 0]
        text = self.tokenizer.decode(self.settings.text_tokens(tokens), skip_special_tokens=True).strip()
        language_id = int(outputs["language"][0])
        spoken = next((c for c, i in self.settings.languages.items() if i == language_id), code or "")
        spoken = next((name for name, c in self.settings.names.items() if c == spoken), spoken)  # OpenAI's: a name
        return _formatted(response_format, text, task, spoken, seconds, tokens, temperature, outputs)

    def _prompt(self, text: str, language: str | None, task: str) -> list[int]:
        """The decoder's prompt: the earlier text's tokens (at most half the decoder's positions, as Whisper takes
        them), the start token, the language (where given or configured), the task, no timestamps."""
        previous = None
        if text.strip():
            if len(text) > MAX_PROMPT_CHARS:
                raise ClientError(f"prompt holds {len(text)} characters; at most {MAX_PROMPT_CHARS}", 413)
            previous = self.tokenizer.encode(" " + text.strip(), add_special_tokens=False).ids
            room = self.settings.positions // 2 - 1
            if len(previous) + 5 > room:
                raise ClientError(f"prompt holds {len(previous)} tokens; this model takes at most {room - 5}")
        return self.settings.prompt(language, task, previous)

    def _features(self, upload: bytes) -> tuple[np.ndarray, float]:
        decoded = decode_audio(upload, self.features.sampling_rate, self.config.max_audio_seconds)
        window = self.settings.window_seconds
        if decoded.seconds > window:
            raise ClientError(
                f"the audio lasts {decoded.seconds:.1f} s; this service transcribes up to {window:g} s at once (the "
                "model's window): send shorter clips (long-form transcription is not served yet)",
                413,
            )
        return self.features(decoded.waveform), decoded.seconds

    def run(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The encoder on the batch, then the decoder a token at a time (contract/speech.py), in the model thread;
        each clip's language detected where the prompt has none."""
        runtime = self.serving.runtime
        cross = runtime.run_named({"input_features": rows["input_features"]})  # each decoder layer's keys, values
        prompt, temperature = [int(t) for t in rows["prompt"][0]], float(rows["temperature"][0])
        count = len(rows["input_features"])
        found: list[list[int]] = [[] for _ in range(count)]
        logprobs = np.zeros(count, dtype=np.float32)
        languages = np.full(count, -1, dtype=np.int64)
        by_prompt: dict[tuple[int, ...], list[int]] = {}
        for row in range(count):

            def one(ids: np.ndarray, row: int = row) -> np.ndarray:
                return runtime.run_named({"input_ids": ids, **{k: v[row : row + 1] for k, v in cross.items()}})[
                    "logits"
                ]

            detected = self.settings.with_language(one, prompt, self.settings.task)
            by_prompt.setdefault(tuple(detected), []).append(row)
        for full, members in by_prompt.items():
            chosen = {name: value[members] for name, value in cross.items()}

            def decoder(ids: np.ndarray, chosen: dict[str, np.ndarray] = chosen) -> np.ndarray:
                return runtime.run_named({"input_ids": ids, **chosen})["logits"]

            tokens, steps = self.settings.decode(decoder, list(full), len(members), temperature)
            language = next((t for t in full if t in self.settings.languages.values()), -1)
            for index, row in enumerate(members):
                found[row] = tokens[index]
                languages[row] = language
                logprobs[row] = _mean_logprob(steps[index], tokens[index] + [self.settings.end])
        longest = max(1, *(len(t) for t in found))
        padded = np.full((count, longest), -1, dtype=np.int64)
        for row, generated in enumerate(found):
            padded[row, : len(generated)] = generated
        return {"tokens": padded, "language": languages, "avg_logprob": logprobs}

    def info(self) -> dict[str, Any]:
        speech = {k: self.manifest["speech"][k] for k in ("languages", "tasks", "language", "task", "window_seconds")}
        return {"audio": {**self.manifest["audio"], "max_seconds": self.config.max_audio_seconds}, "speech": speech}


def _temperature(value: str) -> float:
    try:
        temperature = float(value)
    except ValueError:
        raise ClientError(f"temperature={value[:20]}: a number from 0 to 1") from None
    if not 0 <= temperature <= 1:
        raise ClientError(f"temperature={value[:20]}: a number from 0 to 1")
    return temperature


def _mean_logprob(steps: list[np.ndarray], chosen: list[int]) -> float:
    """The mean log-probability of the chosen tokens under the processed logits (verbose_json's avg_logprob)."""
    total = 0.0
    for logits, token in zip(steps, chosen, strict=False):
        finite = logits[np.isfinite(logits)]
        total += float(logits[token] - (finite.max() + np.log(np.exp(finite - finite.max()).sum())))
    return total / max(1, min(len(steps), len(chosen)))


def _timestamp(seconds: float, separator: str) -> str:
    whole = int(seconds)
    return (
        f"{whole // 3600:02d}:{whole % 3600 // 60:02d}:{whole % 60:02d}{separator}{int((seconds - whole) * 1000):03d}"
    )


def _formatted(
    response_format: str,
    text: str,
    task: str,
    language: str,
    seconds: float,
    tokens: list[int],
    temperature: float,
    outputs: dict[str, np.ndarray],
) -> Answer:
    """The answer in OpenAI's `response_format`: one segment, the whole clip (no timestamp tokens are decoded)."""
    if response_format == "json":
        return Answer({"text": text})
    if response_format == "text":
        return Answer(text.encode(), "text/plain; charset=utf-8")
    if response_format == "srt":
        body = f"1\n{_timestamp(0, ',')} --> {_timestamp(seconds, ',')}\n{text}\n\n"
        return Answer(body.encode(), "text/plain; charset=utf-8")
    if response_format == "vtt":
        body = f"WEBVTT\n\n{_timestamp(0, '.')} --> {_timestamp(seconds, '.')}\n{text}\n\n"
        return Answer(body.encode(), "text/vtt; charset=utf-8")
    segment = {
        "id": 0,
        "seek": 0,
        "start": 0.0,
        "end": round(seconds, 3),
        "text": text,
        "tokens": tokens,
        "temperature": temperature,
        "avg_logprob": float(outputs["avg_logprob"][0]),
    }
    verbose = {"task": task, "language": language, "duration": round(seconds, 3), "text": text, "segments": [segment]}
    return Answer(orjson.dumps(verbose))
