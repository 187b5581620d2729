"""An audio classifier (a Hugging Face wav2vec2, HuBERT or AST fine-tuned with Trainer): an audio file in, its
classes best first out, as transformers' audio-classification pipeline answers.

- POST /classify: an audio file, the multipart form's `file` (and `top_k`) or the file itself as the body
  (`?top_k=K`); decoded, mixed to one channel and resampled to the model's rate (contract/audio.py), its features
  computed as the export proved them (contract/audio_features.py), in a decoding thread;
  -> `{"predictions": [{"label", "index", "probability"}, ...], "seconds": the clip's duration}`;
- POST /predict: the model's features by name (`input_values`), as any model's inputs;
- the protocol: `waveform` (FP32 [N, samples]: clips at the model's rate, one a row) or `audio` (BYTES: encoded
  files, decoded as /classify decodes them), one of the two; `logits` and `probabilities` out.

A spectrogram model's rows are all one shape, so requests share batches; a waveform model's share one only with
clips of the same length (the batcher's default: rows of one shape), since padding a clip would change its answer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from contract.audio import decode_audio
from contract.audio_features import FEATURE_TABLES, AudioFeatures
from contract.errors import ClientError
from contract.manifest import labels_of, read_artifact
from contract.signature import TASK_AUDIO_CLASSIFICATION
from serve.http.endpoint import Answer, Endpoint, Incoming
from serve.protocols.oip_codec import InferRequest, OutputTensor
from serve.protocols.tensors import AUDIO_INPUT, WAVEFORM_INPUT, ServedTensor
from serve.tasks.audio import audio_files, audio_route
from serve.tasks.base import TOP_K, ProtocolTask, Serving, checked_top_k, numeric_inputs, one_param, only_params
from serve.tasks.ranking import PREDICTIONS, classifier_outputs, predictions, ranked, with_probabilities

CLASSIFY_FIELDS = {"file": "file", "top_k": "integer"}  # the multipart form's fields, checked by the front door
ANSWER = {**PREDICTIONS, "properties": {**PREDICTIONS["properties"], "seconds": {"type": "number"}}}
WARM_SECONDS = 1.0  # a waveform model is warmed up on a clip this long (its shapes are the clips')


class AudioClassification(ProtocolTask):
    name = TASK_AUDIO_CLASSIFICATION
    kind = "an audio classifier"

    def __init__(self, serving: Serving) -> None:
        super().__init__(serving)
        section = self.manifest["audio"]
        tables = read_artifact(serving.folder, self.manifest, FEATURE_TABLES) if "tables" in section else None
        self.features = AudioFeatures.from_manifest(section, tables)
        self.labels: list[str] = labels_of(self.manifest) or []
        self.scores: str = self.manifest.get("scores", "softmax")

    def run(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        return ranked(self.serving.runtime(rows), self.scores)

    def warm_up(self) -> None:
        row = self.features(np.zeros(int(WARM_SECONDS * self.features.sampling_rate), np.float32))
        sizes = self.config.batch_buckets() if self.features.row_shape else [1]
        for size in sizes:
            self.serving.runtime(np.repeat(row[None], size, axis=0))

    def endpoints(self) -> list[Endpoint]:
        classify = audio_route(
            "/classify",
            "classes, best first: an audio file (a multipart form with `file` and `top_k`, or the file as the body)",
            self.classify,
            ("application/json", ANSWER),
            CLASSIFY_FIELDS,
            query=({"name": "top_k", "in": "query", "required": False, "schema": TOP_K},),
        )
        return [classify, self.predict_route()]

    async def classify(self, request: Incoming) -> Answer:
        """POST /classify: an audio file -> its top_k classes, best first."""
        only_params(request.params, {"top_k"})
        top_k = checked_top_k(one_param(request.params, "top_k", "5"))
        rows, seconds = await self.serving.decoders.run(self._prepare, request.body)
        outputs = await self.serving.batched(rows[None])
        return Answer({"predictions": predictions(outputs, self.labels, top_k), "seconds": round(seconds, 3)})

    def _prepare(self, upload: bytes) -> tuple[np.ndarray, float]:
        decoded = decode_audio(upload, self.features.sampling_rate, self.config.max_audio_seconds)
        return self.features(decoded.waveform), decoded.seconds

    def protocol_tensors(self) -> tuple[list[ServedTensor], list[ServedTensor]]:
        _, outputs = super().protocol_tensors()
        inputs = [
            ServedTensor(WAVEFORM_INPUT, "FP32", (-1, -1), optional=True),
            ServedTensor(AUDIO_INPUT, "BYTES", (-1, 1), optional=True),
        ]
        return inputs, with_probabilities(outputs)

    async def infer(self, request: InferRequest) -> list[OutputTensor]:
        if set(request.inputs) not in ({WAVEFORM_INPUT}, {AUDIO_INPUT}):
            given = f"got {', '.join(sorted(request.inputs))}"
            raise ClientError(
                f"send one input, 'waveform' (FP32 [N, samples] at {self.features.sampling_rate} Hz) or 'audio' "
                f"(BYTES [N]: encoded files); {given}"
            )
        if AUDIO_INPUT in request.inputs:
            files = audio_files(request, self.config.max_batch_size)
            rows = await self.serving.decoders.run(self._prepare_files, files)
        else:
            rows = await self.serving.decoders.run(self._waveform_rows, numeric_inputs(request, [WAVEFORM_INPUT]))
        return classifier_outputs(request, await self.serving.batched(rows), self.labels)

    def _waveform_rows(self, given: dict[str, np.ndarray]) -> np.ndarray:
        """The protocol's clips (FP32 [N, samples] at the model's rate) as the model's rows."""
        clips = given[WAVEFORM_INPUT]
        if clips.ndim != 2 or clips.dtype != np.float32 or not clips.shape[1]:
            raise ClientError(f"input 'waveform' must be FP32 of shape [N, samples], got {list(clips.shape)}")
        if clips.shape[0] > self.config.max_batch_size:
            raise ClientError(f"input 'waveform' holds {clips.shape[0]} clips; at most {self.config.max_batch_size}")
        limit = self.config.max_audio_seconds * self.features.sampling_rate
        if clips.shape[1] > limit:
            raise ClientError(f"a clip lasts more than {self.config.max_audio_seconds} s, this service's limit", 413)
        if not np.isfinite(clips).all():
            raise ClientError("input 'waveform' holds a NaN or an infinity")
        return np.stack([self.features(clip) for clip in clips])

    def _prepare_files(self, files: list[bytes]) -> np.ndarray:
        """Encoded audio files -> the model's rows, each decoded as /classify does; a waveform model's clips must
        share one length to share a call."""
        rows = []
        for index, data in enumerate(files):
            try:
                rows.append(self._prepare(data)[0])
            except ClientError as err:
                raise ClientError(f"audio[{index}]: {err}", err.status) from None
        if len({row.shape for row in rows}) > 1:
            raise ClientError("the audio files decode to clips of different lengths; send them one request each")
        return np.stack(rows)

    def info(self) -> dict[str, Any]:
        audio = {**self.manifest["audio"], "max_seconds": self.config.max_audio_seconds}
        return super().info() | {"labels": self.labels, "scores": self.scores, "audio": audio}
