"""What an audio model's feature extractor makes of a waveform, in numpy alone, so the service needs neither
transformers nor torch. The export reads the settings from the user's own extractor, stores them in the manifest
(`audio`) and any table they need (a mel filter bank, a window) in a file the manifest hashes, and proves these
features equal to the extractor's on clips it never trained on (export/audio.py).

Three kinds, as transformers' audio models take them:
- `waveform` (wav2vec2, HuBERT, WavLM...: Wav2Vec2FeatureExtractor): the samples themselves, each clip scaled to zero
  mean and unit variance where the extractor normalizes (`do_normalize`);
- `fbank` (the Audio Spectrogram Transformer: ASTFeatureExtractor without torchaudio): Kaldi-style log mel filter
  banks (25 ms frames every 10 ms, each frame's mean removed, pre-emphasis, a window, the power spectrum through the
  mel filters, floored and logged), padded with zeros or cut to the model's frames, then standardized by the
  extractor's mean and twice its deviation;
- `log_mel` (Whisper: WhisperFeatureExtractor): the clip padded with zeros (or cut) to the extractor's window
  (`chunk_length` seconds), a centred, reflect-padded short-time Fourier transform with a Hann window, its power
  through the mel filters, floored at 1e-10 and in log10, the last frame dropped, clamped to 8 below its maximum and
  scaled as (x + 4) / 4.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

FEATURE_TABLES = "audio_features.npz"  # a spectrogram's window and mel filter bank, as the extractor holds them


@dataclass(frozen=True)
class Spectrogram:
    """A log mel filter bank's settings (`fbank`)."""

    frame_length: int
    hop_length: int
    fft_length: int
    preemphasis: float
    remove_dc_offset: bool
    mel_floor: float
    max_frames: int
    mean: float | None  # standardized as (x - mean) / (2 * std) where both are given
    std: float | None
    window_samples: int | None = None  # log_mel: every clip padded or cut to this many samples first


@dataclass(frozen=True)
class AudioFeatures:
    """A feature extractor's settings: which kind, the sampling rate the model takes, and the kind's own."""

    kind: str  # "waveform" | "fbank" | "log_mel"
    sampling_rate: int
    normalize: bool = False  # waveform: zero mean, unit variance per clip
    spectrogram: Spectrogram | None = None
    window: np.ndarray | None = None  # fbank: frame_length values
    mel_filters: np.ndarray | None = None  # fbank: (fft_length // 2 + 1) x mel bins

    def to_manifest(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"kind": self.kind, "sampling_rate": self.sampling_rate, "normalize": self.normalize}
        if self.spectrogram is not None:
            fields["spectrogram"] = asdict(self.spectrogram)
            fields["tables"] = FEATURE_TABLES
        return fields

    def tables(self) -> bytes:
        """The window and mel filters as the file FEATURE_TABLES holds them."""
        assert self.window is not None and self.mel_filters is not None, "a spectrogram's tables"
        buffer = io.BytesIO()
        np.savez(buffer, window=self.window, mel_filters=self.mel_filters)
        return buffer.getvalue()

    @classmethod
    def from_manifest(cls, fields: dict[str, Any], tables: bytes | None) -> AudioFeatures:
        """The settings a manifest records, with the tables file's verified bytes where the kind needs them."""
        kind = fields["kind"]
        if kind == "waveform":
            return cls(kind, int(fields["sampling_rate"]), bool(fields.get("normalize", False)))
        if kind not in ("fbank", "log_mel") or tables is None:
            raise ValueError(f"audio features {kind!r}: this service computes waveform, fbank and log_mel features")
        with np.load(io.BytesIO(tables), allow_pickle=False) as stored:
            window, filters = stored["window"], stored["mel_filters"]
        return cls(kind, int(fields["sampling_rate"]), False, Spectrogram(**fields["spectrogram"]), window, filters)

    @property
    def row_shape(self) -> tuple[int, ...]:
        """One clip's features without the batch: () where the length is the clip's own."""
        if self.spectrogram is None or self.mel_filters is None:
            return ()
        if self.kind == "log_mel":  # mel bins x frames, as Whisper's encoder takes them
            return (self.mel_filters.shape[1], self.spectrogram.max_frames)
        return (self.spectrogram.max_frames, self.mel_filters.shape[1])

    def __call__(self, waveform: np.ndarray) -> np.ndarray:
        """One clip's features (float32), as the model takes one row."""
        if self.kind == "waveform":
            samples = waveform.astype(np.float64)
            if self.normalize:
                samples = (samples - samples.mean()) / np.sqrt(samples.var() + 1e-7)
            return samples.astype(np.float32)
        if self.kind == "log_mel":
            return self._log_mel(waveform)
        return self._fbank(waveform)

    def _log_mel(self, waveform: np.ndarray) -> np.ndarray:
        spec, window, filters = self.spectrogram, self.window, self.mel_filters
        assert spec is not None and window is not None and filters is not None and spec.window_samples is not None
        samples = np.zeros(spec.window_samples, np.float64)
        samples[: min(len(waveform), spec.window_samples)] = waveform[: spec.window_samples]
        half = spec.frame_length // 2
        padded = np.pad(samples, half, mode="reflect")
        frames = np.lib.stride_tricks.sliding_window_view(padded, spec.frame_length)[:: spec.hop_length]
        power = np.abs(np.fft.rfft(frames * window, n=spec.fft_length, axis=1)) ** 2
        mel = np.log10(np.maximum(spec.mel_floor, power @ filters)).T[:, :-1]  # mel bins x frames
        mel = np.maximum(mel, mel.max() - 8.0)
        return ((mel + 4.0) / 4.0).astype(np.float32)

    def _fbank(self, waveform: np.ndarray) -> np.ndarray:
        spec, window, filters = self.spectrogram, self.window, self.mel_filters
        assert spec is not None and window is not None and filters is not None
        samples = waveform.astype(np.float64)
        if len(samples) < spec.frame_length:  # not one whole frame: no features, all padding
            frames = np.zeros((0, spec.frame_length))
        else:
            frames = np.lib.stride_tricks.sliding_window_view(samples, spec.frame_length)[:: spec.hop_length].copy()
        if spec.remove_dc_offset:
            frames -= frames.mean(axis=1, keepdims=True)
        if spec.preemphasis:
            frames[:, 1:] -= spec.preemphasis * frames[:, :-1].copy()
            frames[:, 0] *= 1 - spec.preemphasis
        power = np.abs(np.fft.rfft(frames * window, n=spec.fft_length, axis=1)) ** 2
        mel = np.log(np.maximum(spec.mel_floor, power @ filters))
        rows = np.zeros((spec.max_frames, filters.shape[1]), np.float64)
        rows[: min(len(mel), spec.max_frames)] = mel[: spec.max_frames]
        if spec.mean is not None and spec.std is not None:
            rows = (rows - spec.mean) / (spec.std * 2)
        return rows.astype(np.float32)
