"""Audio files as users send them, written by the real encoders (libsndfile's, FFmpeg's through `av`): the tests'
and the benchmarks' clips in every container the service decodes."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

# container -> (av's muxer, codec), for the formats libsndfile does not write
FFMPEG_FORMATS = {"mp3": ("mp3", "libmp3lame"), "m4a": ("ipod", "aac"), "webm": ("webm", "libopus")}
SNDFILE_FORMATS = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"), "ogg": ("OGG", "VORBIS")}
OPUS_RATE = 48_000  # the one rate Opus encodes


def encoded(samples: np.ndarray, rate: int, container: str) -> bytes:
    """`samples` (frames, or frames x channels, float32 in [-1, 1]) at `rate` as a `container` file."""
    frames = samples if samples.ndim == 2 else samples[:, None]
    if container in SNDFILE_FORMATS:
        import soundfile

        buffer = io.BytesIO()
        fmt, subtype = SNDFILE_FORMATS[container]
        soundfile.write(buffer, frames, rate, format=fmt, subtype=subtype)
        return buffer.getvalue()
    import av

    muxer, codec = FFMPEG_FORMATS[container]
    layout = "mono" if frames.shape[1] == 1 else "stereo"
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=muxer) as media:
        stream: Any = media.add_stream(codec, rate=OPUS_RATE if codec == "libopus" else rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(frames.T, np.float32), format="fltp", layout=layout)
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            media.mux(packet)
        for packet in stream.encode(None):
            media.mux(packet)
    return buffer.getvalue()


def tone(hz: float, seconds: float, rate: int, level: float = 0.4) -> np.ndarray:
    return (level * np.sin(2 * np.pi * hz * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


# The tests' "speech": each word a tone of its own pitch (Hz), which a tiny Whisper learns to transcribe.
WORD_PITCHES = {"one": 330, "two": 520, "three": 740, "four": 990, "five": 1310}


def spoken(words: list[str], rng: np.random.Generator, rate: int = 16_000) -> np.ndarray:
    """The words as tones, a third of a second each with a short gap, at a random level, with a little noise."""
    parts = []
    for word in words:
        t = np.arange(int(rate / 3)) / rate
        parts += [np.sin(2 * np.pi * WORD_PITCHES[word] * t) * np.hanning(len(t)), np.zeros(rate // 20)]
    clip = rng.uniform(0.2, 0.5) * np.concatenate(parts)
    return (clip + 0.01 * rng.standard_normal(len(clip))).astype(np.float32)
