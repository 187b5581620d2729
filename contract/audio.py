"""An audio file's bytes to the waveform a speech or audio model takes: one channel of float32 samples at the model's
rate, decoded by real libraries and bounded before and while decoding.

- WAV, FLAC and OGG (Vorbis, Opus) through libsndfile (`soundfile`); MP3, M4A (AAC) and WebM (Opus) through FFmpeg's
  libraries (`av`), each opened with the one demuxer its first bytes name, so no playlist or concat demuxer ever
  reads another file;
- the header's duration is checked before anything is decoded, and the samples are counted as they come: a small file
  that declares (or decodes to) more than `max_seconds` is refused, a 413, and never held whole;
- channels are averaged into one, as transformers' audio pipelines' FFmpeg read (`-ac 1`) mixes them, and resampled
  to the model's rate with soxr's streaming resampler block by block, so what a request holds is the model's
  waveform alone.

Torch-free: the service's Bento carries it, and the export uses it to prove that what the service decodes is what the
library is given.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from contract.errors import ClientError

# The media types of an audio body, and what each is decoded with.
AUDIO_TYPES = (
    "audio/wav",
    "audio/x-wav",
    "audio/wave",
    "audio/flac",
    "audio/ogg",
    "audio/mpeg",
    "audio/mp4",
    "audio/x-m4a",
    "audio/webm",
    "video/webm",
)
FORMATS = "WAV, FLAC, OGG (Vorbis, Opus), MP3, M4A (AAC) or WebM (Opus)"
MAX_RATE = 384_000  # the highest sample rate a file may declare (studio audio is 192 kHz)
MAX_CHANNELS = 16
BLOCK_FRAMES = 1 << 16  # decoded, mixed and resampled a block at a time
UNKNOWN_FRAMES = 1 << 62  # libsndfile's count for a stream that does not say its length (SF_COUNT_MAX)


@dataclass(frozen=True)
class Decoded:
    """A file's waveform at the model's rate, and what the file itself was."""

    waveform: np.ndarray  # float32, one channel, at `rate`
    rate: int
    source_rate: int
    channels: int
    container: str

    @property
    def seconds(self) -> float:
        return len(self.waveform) / self.rate


def container_of(data: bytes) -> str:
    """The container the file's first bytes name; ClientError for one handoff does not decode."""
    head = data[:16]
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[4:8] == b"ftyp":
        return "mp4"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"
    if head[:3] == b"ID3" or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "mp3"
    if not data:
        raise ClientError("the audio file is empty")
    raise ClientError(f"not an audio file handoff decodes: send {FORMATS}", 415)


def decode_audio(data: bytes, rate: int, max_seconds: float) -> Decoded:
    """`data` decoded to one channel of float32 samples at `rate`; ClientError (400, 413 or 415) for a file that is
    not audio, is damaged, or lasts more than `max_seconds`."""
    container = container_of(data)
    blocks = _sndfile_blocks(data, max_seconds) if container in ("wav", "flac", "ogg") else None
    if blocks is None:
        blocks = _ffmpeg_blocks(data, container, max_seconds)
    source_rate, channels = next(blocks)
    resampler = None
    if source_rate != rate:
        import soxr

        resampler = soxr.ResampleStream(source_rate, rate, 1, dtype="float32", quality="HQ")
    out: list[np.ndarray] = []
    taken, limit = 0, int(max_seconds * source_rate)
    try:
        for block in blocks:
            taken += len(block)
            if taken > limit:
                raise ClientError(f"the audio lasts more than {max_seconds:g} s, this service's limit", 413)
            mono = block.mean(axis=1, dtype=np.float32) if block.shape[1] > 1 else block[:, 0]
            out.append(resampler.resample_chunk(mono) if resampler is not None else mono)
    except (RuntimeError, ValueError, OSError) as err:
        if isinstance(err, ClientError):
            raise
        raise ClientError(f"the {container} audio could not be decoded: {_first_line(err)}") from None
    if resampler is not None:
        out.append(resampler.resample_chunk(np.zeros(0, np.float32), last=True))
    waveform = np.concatenate(out).astype(np.float32, copy=False) if out else np.zeros(0, np.float32)
    if not len(waveform):
        raise ClientError(f"the {container} file holds no audio samples")
    return Decoded(waveform, rate, source_rate, channels, container)


def _checked_stream(rate: int, channels: int, declared_seconds: float | None, max_seconds: float) -> None:
    if not 0 < rate <= MAX_RATE:
        raise ClientError(f"the audio declares {rate} samples a second; handoff takes 1 to {MAX_RATE}")
    if not 0 < channels <= MAX_CHANNELS:
        raise ClientError(f"the audio declares {channels} channels; handoff takes 1 to {MAX_CHANNELS}")
    if declared_seconds is not None and declared_seconds > max_seconds:
        raise ClientError(
            f"the audio declares {declared_seconds:.1f} s; this service takes up to {max_seconds:g} s", 413
        )


def _sndfile_blocks(data: bytes, max_seconds: float) -> Iterator:
    """libsndfile's decoding: first (rate, channels), then blocks of frames x channels."""
    import soundfile

    try:
        sound = soundfile.SoundFile(io.BytesIO(data))
    except (RuntimeError, soundfile.LibsndfileError) as err:
        raise ClientError(f"the audio could not be decoded: {_first_line(err)}") from None
    with sound:
        known = 0 < sound.frames < UNKNOWN_FRAMES and sound.samplerate
        declared = sound.frames / sound.samplerate if known else None
        _checked_stream(sound.samplerate, sound.channels, declared, max_seconds)
        yield sound.samplerate, sound.channels
        while True:
            block = sound.read(BLOCK_FRAMES, dtype="float32", always_2d=True)
            if not len(block):
                return
            yield block


def _ffmpeg_blocks(data: bytes, container: str, max_seconds: float) -> Iterator:
    """FFmpeg's decoding of the first audio stream, opened with the demuxer `container` names alone: first (rate,
    channels), then blocks of frames x channels."""
    import av

    try:
        media = av.open(io.BytesIO(data), format=container, mode="r")
    except (av.FFmpegError, ValueError, OSError) as err:
        raise ClientError(f"the {container} audio could not be opened: {_first_line(err)}") from None
    with media:
        if not media.streams.audio:
            raise ClientError(f"the {container} file holds no audio stream")
        stream = media.streams.audio[0]
        declared = None
        if stream.duration is not None and stream.time_base is not None:
            declared = float(stream.duration * stream.time_base)
        elif media.duration is not None:
            declared = media.duration / 1_000_000
        rate, channels = stream.codec_context.sample_rate or stream.rate or 0, stream.codec_context.channels
        _checked_stream(rate, channels, declared, max_seconds)
        yield rate, channels
        try:
            for frame in media.decode(stream):
                if frame.sample_rate != rate:
                    raise ClientError(f"the {container} audio changes its sample rate midway")
                samples = frame.to_ndarray()
                if frame.format.is_planar:  # channels x frames
                    block = samples.T
                else:  # 1 x (frames * channels), interleaved
                    block = samples.reshape(-1, len(frame.layout.channels))
                yield _as_float32(block)
        except av.FFmpegError as err:
            raise ClientError(f"the {container} audio could not be decoded: {_first_line(err)}") from None


def _as_float32(block: np.ndarray) -> np.ndarray:
    """Samples of any of FFmpeg's sample formats as floats in [-1, 1]."""
    if block.dtype.kind == "f":
        return block.astype(np.float32, copy=False)
    if block.dtype == np.uint8:
        return (block.astype(np.float32) - 128.0) / 128.0
    return block.astype(np.float32) / float(-np.iinfo(block.dtype).min)


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
