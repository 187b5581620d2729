"""contract/audio.py on files the real encoders wrote: every container decoded to the model's rate and one channel,
the channels averaged, lossless ones sample for sample; a file declaring or decoding to more than the bound refused
before it is held whole; what is not audio refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from contract.audio import decode_audio
from contract.audio_features import AudioFeatures
from contract.errors import ClientError
from harness.audio_files import encoded, tone

RATE = 16_000


def dominant_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.argmax(spectrum) * rate / len(samples))


@pytest.mark.parametrize("container", ["wav", "flac", "ogg", "mp3", "m4a", "webm"])
def test_every_container_decodes_to_one_channel_at_the_models_rate(container):
    stereo = np.stack([tone(440, 2.0, 44_100), tone(440, 2.0, 44_100, level=0.2)], axis=1)
    decoded = decode_audio(encoded(stereo, 44_100, container), RATE, 60)
    assert decoded.channels == 2 and decoded.rate == RATE and decoded.waveform.dtype == np.float32
    assert abs(decoded.seconds - 2.0) < 0.1, decoded.seconds  # AAC and Opus add a little priming
    assert abs(dominant_hz(decoded.waveform, RATE) - 440) < 2
    middle = decoded.waveform[RATE // 2 : 3 * RATE // 2]  # clear of the codecs' priming and edges
    assert abs(float(np.sqrt(np.mean(middle**2))) - 0.3 / np.sqrt(2)) < 0.02  # a tone of the average 0.4 and 0.2


def test_lossless_files_decode_sample_for_sample_mixed_and_resampled_by_soxr():
    left, right = tone(300, 1.0, 22_050), tone(1000, 1.0, 22_050, level=0.3)
    stereo = np.stack([left, right], axis=1)
    decoded = decode_audio(encoded(stereo, 22_050, "flac"), RATE, 60)
    quantized = np.round(stereo * 32767) / 32768  # 16-bit FLAC
    expected = soxr.resample(quantized.mean(axis=1).astype(np.float32), 22_050, RATE, quality="HQ")
    np.testing.assert_allclose(decoded.waveform, expected, atol=1e-4)  # block by block, as one call within 1e-4
    same_rate = decode_audio(encoded(left, RATE, "wav"), RATE, 60)
    np.testing.assert_allclose(same_rate.waveform, left, atol=1.01 / 32768)  # one 16-bit step: nothing resampled


def test_a_declared_duration_past_the_bound_is_refused_before_decoding():
    with pytest.raises(ClientError, match="declares 3.0 s") as refused:
        decode_audio(encoded(tone(440, 3.0, RATE), RATE, "flac"), RATE, 2)
    assert refused.value.status == 413


def test_a_file_whose_header_understates_its_length_is_refused_as_it_decodes():
    """A FLAC of ten seconds whose header says its length is unknown (as a streamed encoder leaves it): nothing to
    check before decoding, so the decoded samples are counted and the file refused when they pass the bound."""
    lying = bytearray(encoded(tone(440, 10.0, RATE), RATE, "flac"))
    lying[21] &= 0xF0  # STREAMINFO's 36-bit total samples (from byte 21's low nibble): 0, unknown
    lying[22:26] = bytes(4)
    with pytest.raises(ClientError, match="lasts more than 3 s") as refused:
        decode_audio(bytes(lying), RATE, 3)
    assert refused.value.status == 413


@pytest.mark.parametrize(
    ("data", "status", "words"),
    [
        (b"", 400, "empty"),
        (b"%PDF-1.7 not audio", 415, "not an audio file"),
        (b"RIFF\x00\x00\x00\x00WAVEfmt garbage", 400, "could not be decoded"),
        (b"fLaC" + bytes(60), 400, "could not be decoded"),
        (b"\x1a\x45\xdf\xa3" + bytes(60), 400, "could not be"),
    ],
)
def test_what_is_not_audio_is_refused_in_one_line(data, status, words):
    with pytest.raises(ClientError, match=words) as refused:
        decode_audio(data, RATE, 60)
    assert refused.value.status == status and "\n" not in str(refused.value)


def test_a_waveform_models_features_are_the_clip_normalized():
    clip = tone(440, 0.5, RATE) + 0.1
    features = AudioFeatures("waveform", RATE, normalize=True)(clip)
    assert abs(float(features.mean())) < 1e-5 and abs(float(features.std()) - 1) < 1e-3
    np.testing.assert_array_equal(AudioFeatures("waveform", RATE)(clip), clip)
