"""What the audio tasks share at export: the user's feature extractor read from the checkpoint's folder, its settings
as the contract's numpy features (contract/audio_features.py), the clips parity runs on, and the check that the
service's features equal the extractor's on them.

The clips are synthesised here, deterministically, and are not what any user trains on: a rising chirp, chords of
tones, a tone in noise, bursts of noise, a near-silence with a click, at lengths from a third of a second to several
seconds, each at the model's sampling rate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from contract.audio_features import AudioFeatures, Spectrogram
from export.parity import Tolerance
from export.pipeline import Check

FEATURE_EXTRACTOR = "feature extractor, which says how audio becomes the model's input"
# transformers' numpy spectrogram for ASTFeatureExtractor (its fallback without torchaudio; the one handoff proves)
AST_FRAME_LENGTH, AST_HOP_LENGTH, AST_FFT_LENGTH, AST_PREEMPHASIS = 400, 160, 512, 0.97
AST_MEL_FLOOR = 1.192092955078125e-07


def load_extractor(folder: Path, trust_remote_code: bool) -> Any:
    import transformers

    return transformers.AutoFeatureExtractor.from_pretrained(
        folder, local_files_only=True, trust_remote_code=trust_remote_code
    )


def features_of(extractor: Any) -> AudioFeatures:
    """The contract's features for `extractor`; ValueError, in one line, for an extractor handoff does not compute."""
    name = type(extractor).__name__
    rate = int(extractor.sampling_rate)
    if name == "Wav2Vec2FeatureExtractor":
        if int(getattr(extractor, "feature_size", 1)) != 1:
            raise ValueError(f"{name} with feature_size {extractor.feature_size}: handoff takes one channel")
        return AudioFeatures("waveform", rate, bool(extractor.do_normalize))
    if name == "ASTFeatureExtractor":
        spectrogram = Spectrogram(
            AST_FRAME_LENGTH,
            AST_HOP_LENGTH,
            AST_FFT_LENGTH,
            AST_PREEMPHASIS,
            remove_dc_offset=True,
            mel_floor=AST_MEL_FLOOR,
            max_frames=int(extractor.max_length),
            mean=float(extractor.mean) if extractor.do_normalize else None,
            std=float(extractor.std) if extractor.do_normalize else None,
        )
        window = np.asarray(extractor.window, np.float64)
        filters = np.asarray(extractor.mel_filters, np.float64)
        return AudioFeatures("fbank", rate, False, spectrogram, window, filters)
    if name == "WhisperFeatureExtractor":
        from transformers.audio_utils import window_function

        spectrogram = Spectrogram(
            int(extractor.n_fft),
            int(extractor.hop_length),
            int(extractor.n_fft),
            0.0,
            remove_dc_offset=False,
            mel_floor=1e-10,
            max_frames=int(extractor.nb_max_frames),
            mean=None,
            std=None,
            window_samples=int(extractor.n_samples),
        )
        if float(getattr(extractor, "dither", 0.0) or 0.0) != 0.0:
            raise ValueError(f"{name} with dither {extractor.dither}: its features are random; handoff's are not")
        window = np.asarray(window_function(int(extractor.n_fft), "hann"), np.float64)
        return AudioFeatures("log_mel", rate, False, spectrogram, window, np.asarray(extractor.mel_filters, np.float64))
    raise ValueError(
        f"feature extractor {name}: handoff computes Wav2Vec2FeatureExtractor's, ASTFeatureExtractor's and "
        "WhisperFeatureExtractor's features"
    )


def parity_clips(rate: int) -> list[np.ndarray]:
    """Synthesised clips (float32, one channel, at `rate`) of several kinds and lengths, none a training clip."""
    noise = np.random.default_rng(20261207)

    def times(seconds: float) -> np.ndarray:
        return np.arange(int(seconds * rate)) / rate

    t = times(1.3)
    chirp = 0.4 * np.sin(2 * np.pi * (150 * t + 900 * t**2))
    t = times(0.35)
    chord = 0.2 * np.sin(2 * np.pi * np.outer(t, [262, 330, 392])).sum(axis=1)
    t = times(2.7)
    tone_in_noise = 0.3 * np.sin(2 * np.pi * 1200 * t) + 0.05 * noise.standard_normal(len(t))
    second = int(1.0 * rate)
    bursts = noise.standard_normal(second) * np.repeat([0.5, 0.0, 0.3, 0.0], second // 4 + 1)[:second]
    click = np.zeros(int(0.6 * rate))
    click[len(click) // 2] = 0.9
    click += 1e-3 * noise.standard_normal(len(click))
    return [clip.astype(np.float32) for clip in (chirp, chord, tone_in_noise, bursts, click)]


def features_check(extractor: Any, features: AudioFeatures, clips: list[np.ndarray], tol: Tolerance) -> Check:
    """The service's features of each clip against the extractor's own (its numpy path, as the library runs it)."""
    worst = 0.0
    for clip in clips:
        given = extractor(clip, sampling_rate=features.sampling_rate, return_tensors="np")
        theirs = given[extractor.model_input_names[0]][0]  # input_values, or Whisper's input_features
        ours = features(clip)
        if theirs.shape != ours.shape:
            return ("feature extractor", f"the service's features are {ours.shape}, the extractor's {theirs.shape}")
        worst = max(worst, float(np.abs(theirs - ours).max() / max(1.0, float(np.abs(theirs).max()))))
    failed = worst > tol.atol + tol.rtol
    return (
        "feature extractor",
        f"the service's features differ from the extractor's by {worst:.2e}" if failed else None,
    )
