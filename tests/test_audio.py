"""Audio classification end to end: a tiny wav2vec2 and a tiny AST trained by Trainer under torchrun (2 gloo
processes), each checkpoint-30 exported with no flags, served on /classify and the protocol, their scores equal to
transformers' audio-classification pipeline's on the same checkpoint, on clips the export never saw, sent in every
container the service decodes; files it cannot take refused in one line."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import soxr
import transformers
import tritonclient.http as triton
from conftest import Server, assert_serves_only_its_routes

from contract.audio import decode_audio
from contract.manifest import read_manifest_unchecked
from harness.audio_files import encoded, tone

pytestmark = pytest.mark.xdist_group("audio")

RATE = 16_000
MODELS = ("wav2vec2", "ast")
ATOL = 2e-4


def unseen_clips() -> dict[str, np.ndarray]:
    """Clips the export's parity never ran on and training never saw: a glide, a tone mixed with noise, a beat."""
    t = np.arange(int(1.7 * RATE)) / RATE
    rng = np.random.default_rng(7)
    return {
        "glide": (0.3 * np.sin(2 * np.pi * (250 * t + 600 * t**2))).astype(np.float32),
        "hum": (tone(180, 0.8, RATE) + 0.05 * rng.standard_normal(int(0.8 * RATE))).astype(np.float32),
        "beat": (tone(3000, 1.2, RATE, 0.3) * (np.arange(int(1.2 * RATE)) % 4000 < 2000)).astype(np.float32),
    }


@pytest.fixture(scope="module")
def servers(audio_run: Path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("audio")
    started = {}
    with (
        Server(folder / "wav2vec2.log", HANDOFF_MODEL_DIR=str(audio_run / "wav2vec2/checkpoint-30.export")) as first,
        Server(
            folder / "ast.log",
            HANDOFF_MODEL_DIR=str(audio_run / "ast/checkpoint-30.export"),
            HANDOFF_MAX_AUDIO_SECONDS="5",
        ) as second,
    ):
        for name, srv in (("wav2vec2", first), ("ast", second)):
            srv.wait_ready()
            started[name] = srv
        yield started


@pytest.fixture(scope="module")
def pipelines(audio_run: Path):
    return {
        name: transformers.pipeline("audio-classification", model=str(audio_run / name / "checkpoint-30"), device="cpu")
        for name in MODELS
    }


def pipeline_scores(pipe, waveform: np.ndarray) -> dict[str, float]:
    return {p["label"]: p["score"] for p in pipe({"raw": waveform, "sampling_rate": RATE}, top_k=None)}


def served_scores(url: str, data: bytes, media_type: str = "audio/wav") -> dict:
    answer = httpx.post(f"{url}/classify", files={"file": ("clip", data, media_type)}, data={"top_k": "3"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.parametrize("name", MODELS)
def test_the_trainer_checkpoints_export_with_no_flags(audio_run: Path, name: str):
    manifest = read_manifest_unchecked(audio_run / name / "checkpoint-30.export")
    assert manifest["task"] == "audio-classification" and manifest["status"] == "passed"
    assert manifest["labels"] == ["low", "high", "noise"]
    assert manifest["audio"]["kind"] == ("waveform" if name == "wav2vec2" else "fbank")
    checks = {c["check"]: c["pass"] for c in manifest["parity"]["audio"]}
    assert checks == {"feature extractor": True, "transformers pipeline": True}, manifest["parity"]["summary"]
    assert (
        manifest["reference"]["library"] == "transformers" and "audio-classification" in manifest["reference"]["call"]
    )
    assert manifest["provenance"]["pass"]


@pytest.mark.parametrize("name", MODELS)
def test_served_scores_are_the_pipelines_on_clips_the_export_never_saw(servers, pipelines, name):
    url = servers[name].url
    for clip_name, clip in unseen_clips().items():
        answer = served_scores(url, encoded(clip, RATE, "flac"))  # 16-bit, as a user's recording is
        heard = decode_audio(encoded(clip, RATE, "flac"), RATE, 60).waveform
        theirs = pipeline_scores(pipelines[name], heard)
        ours = {p["label"]: p["probability"] for p in answer["predictions"]}
        assert ours.keys() == theirs.keys(), (clip_name, answer)
        np.testing.assert_allclose([ours[k] for k in theirs], list(theirs.values()), atol=ATOL, err_msg=clip_name)
        assert answer["predictions"][0]["label"] == max(theirs, key=theirs.__getitem__)
        assert answer["seconds"] == pytest.approx(len(clip) / RATE, abs=1e-3)


def test_every_container_and_rate_is_heard_as_the_pipeline_hears_it_resampled(servers, pipelines):
    """A 44.1 kHz stereo recording in each container: what the service answers is the pipeline's answer on the
    same recording mixed to one channel and resampled to 16 kHz."""
    pipe, url = pipelines["ast"], servers["ast"].url
    stereo = np.stack([tone(300, 1.5, 44_100), tone(310, 1.5, 44_100, 0.2)], axis=1)
    for container, media_type in (
        ("wav", "audio/wav"),
        ("ogg", "audio/ogg"),
        ("mp3", "audio/mpeg"),
        ("m4a", "audio/mp4"),
        ("webm", "audio/webm"),
    ):
        data = encoded(stereo, 44_100, container)
        answer = httpx.post(f"{url}/classify?top_k=3", content=data, headers={"content-type": media_type}, timeout=30)
        assert answer.status_code == 200, (container, answer.text)
        heard = decode_audio(data, RATE, 60).waveform
        theirs = pipeline_scores(pipe, heard)
        ours = {p["label"]: p["probability"] for p in answer.json()["predictions"]}
        np.testing.assert_allclose([ours[k] for k in theirs], list(theirs.values()), atol=ATOL, err_msg=container)
        assert answer.json()["predictions"][0]["label"] == "low", (container, answer.json())
    mixed = soxr.resample(stereo.mean(axis=1), 44_100, RATE, quality="HQ").astype(np.float32)
    exact = decode_audio(encoded(stereo, 44_100, "wav"), RATE, 60).waveform
    np.testing.assert_allclose(exact, mixed, atol=2e-4)  # the WAV's 16 bits and soxr's blocks, no more


@pytest.mark.parametrize("name", MODELS)
def test_the_protocol_takes_the_waveform_and_files(servers, name):
    url, data = servers[name].url, encoded(unseen_clips()["glide"], RATE, "wav")
    clip = decode_audio(data, RATE, 60).waveform  # the WAV's own samples, sent as numbers
    with triton.InferenceServerClient(url.removeprefix("http://"), network_timeout=60) as client:
        waveform = triton.InferInput("waveform", [1, len(clip)], "FP32")
        waveform.set_data_from_numpy(clip[None])
        by_samples = client.infer("handoff", [waveform]).as_numpy("probabilities")[0]
        files = triton.InferInput("audio", [2, 1], "BYTES")
        files.set_data_from_numpy(np.array([[data], [data]], dtype=object))
        by_files = client.infer("handoff", [files]).as_numpy("probabilities")
    ours = {p["label"]: p["probability"] for p in served_scores(url, data)["predictions"]}
    np.testing.assert_allclose(by_files, np.stack([[ours[k] for k in ("low", "high", "noise")]] * 2), atol=1e-5)
    np.testing.assert_allclose(by_samples, by_files[0], atol=1e-5)


@pytest.mark.parametrize(
    ("data", "media_type", "status", "words"),
    [
        (b"%PDF-1.7 not a sound", "audio/wav", 415, "not an audio file"),
        (b"fLaC" + bytes(80), "audio/flac", 400, "could not be decoded"),
        (encoded(tone(440, 6.0, RATE), RATE, "flac"), "audio/flac", 413, "declares 6.0 s"),
        (b'{"file": "x"}', "application/json", 415, "takes an audio file"),
    ],
)
def test_a_file_the_service_cannot_take_is_refused_in_one_line(servers, data, media_type, status, words):
    url = servers["ast"].url  # HANDOFF_MAX_AUDIO_SECONDS=5
    answer = httpx.post(f"{url}/classify", content=data, headers={"content-type": media_type}, timeout=30)
    assert answer.status_code == status and words in answer.json()["error"], answer.text
    assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200


def test_a_spectrogram_models_requests_share_batches_and_only_its_routes_are_served(servers):
    url = servers["ast"].url
    assert_serves_only_its_routes(url, {"POST /classify", "POST /predict"})
    info = httpx.get(f"{url}/info", timeout=10).json()["model"]
    assert info["audio"]["sampling_rate"] == RATE and info["audio"]["max_seconds"] == 5
    # the page offers its drop zone for audio where the form route takes audio (index.html branches on this)
    (classify,) = [r for r in httpx.get(f"{url}/info", timeout=10).json()["routes"] if r["path"] == "/classify"]
    assert {"multipart/form-data", "audio/wav", "audio/mpeg"} <= set(classify["accepts"])
