"""Whisper end to end: a tiny Whisper fine-tuned by Seq2SeqTrainer under torchrun (2 gloo processes) as the "Fine-Tune
Whisper" recipe does, its checkpoint-60 exported with no flags, served as OpenAI's audio API and called with OpenAI's
own SDK; the text equals transformers' `generate` with the folder's generation config, decoded by the processor, on
clips the export never saw, in every response format; what it cannot take refused in OpenAI's error body."""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import transformers
from conftest import Server, assert_serves_only_its_routes

from contract.manifest import read_manifest_unchecked
from harness.audio_files import encoded, spoken

pytestmark = pytest.mark.xdist_group("speech")

RATE = 16_000
SENTENCES = (["two", "four", "one"], ["five", "three"], ["one", "one", "two", "three"])


@pytest.fixture(scope="module")
def clips() -> list[np.ndarray]:
    """Sentences spoken as the fixture speaks them, with another random stream: clips training never saw."""
    rng = np.random.default_rng(99)
    return [spoken(words, rng) for words in SENTENCES]


@pytest.fixture(scope="module")
def library(whisper_run: Path):
    folder = whisper_run / "checkpoint-60"
    model = transformers.WhisperForConditionalGeneration.from_pretrained(folder).eval()
    processor = transformers.WhisperProcessor.from_pretrained(folder)
    return model, processor, transformers.GenerationConfig.from_pretrained(folder)


@pytest.fixture(scope="module")
def server(whisper_run: Path, tmp_path_factory):
    log = tmp_path_factory.mktemp("speech") / "serve.log"
    with Server(log, HANDOFF_MODEL_DIR=str(whisper_run / "checkpoint-60.export"), HANDOFF_MODEL_NAME="whisper") as srv:
        srv.wait_ready()
        yield srv


def transcribed(library, samples: np.ndarray, **options) -> str:
    model, processor, generation = library
    features = processor.feature_extractor(samples, sampling_rate=RATE, return_tensors="pt").input_features
    with torch.inference_mode():
        ids = model.generate(features, generation_config=generation, **options)
    return processor.batch_decode(ids, skip_special_tokens=True)[0].strip()


def heard(data: bytes) -> np.ndarray:
    """The samples of a 16-bit WAV, as the service and the library are given them."""
    import soundfile

    samples, _ = soundfile.read(io.BytesIO(data), dtype="float32")
    return samples


def test_the_recipes_checkpoint_exports_with_no_flags(whisper_run: Path):
    manifest = read_manifest_unchecked(whisper_run / "checkpoint-60.export")
    assert manifest["task"] == "speech-recognition" and manifest["status"] == "passed"
    checks = {c["check"]: c["pass"] for c in manifest["parity"]["speech"]}
    assert checks["feature extractor"] and checks["generate"] and checks["processor decode"], manifest["parity"]
    assert manifest["speech"]["language"] == "en" and manifest["speech"]["task"] == "transcribe"
    assert manifest["audio"]["kind"] == "log_mel" and manifest["towers"] == {"encoder": "encoder", "decoder": "decoder"}
    assert manifest["provenance"]["pass"]


def test_the_openai_sdk_transcribes_as_generate_does(server, library, clips):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    for samples in clips:
        data = encoded(samples, RATE, "wav")
        answer = client.audio.transcriptions.create(model="whisper", file=("clip.wav", data, "audio/wav"))
        expected = transcribed(library, heard(data))
        assert answer.text == expected and not answer.text.startswith(" "), (answer.text, expected)


def test_every_response_format_and_field(server, library, clips):
    data = encoded(clips[0], RATE, "wav")
    expected = transcribed(library, heard(data))
    url = f"{server.url}/v1/audio/transcriptions"

    def ask(**fields):
        answer = httpx.post(url, files={"file": ("c.wav", data, "audio/wav")}, data={"model": "whisper", **fields})
        assert answer.status_code == 200, answer.text
        return answer

    assert ask().json() == {"text": expected}
    assert ask(response_format="text").text == expected
    srt = ask(response_format="srt").text.splitlines()
    assert srt[0] == "1" and srt[1].startswith("00:00:00,000 --> 00:00:01,") and srt[2] == expected
    vtt = ask(response_format="vtt").text.splitlines()
    assert vtt[0] == "WEBVTT" and vtt[3] == expected
    verbose = ask(response_format="verbose_json").json()
    assert verbose["text"] == expected and verbose["language"] == "english" and verbose["task"] == "transcribe"
    assert verbose["duration"] == pytest.approx(len(clips[0]) / RATE, abs=1e-3)
    assert verbose["segments"][0]["end"] == verbose["duration"] and verbose["segments"][0]["temperature"] == 0.0
    # a language, a prompt and a translation, each as generate takes them
    model, processor, generation = library
    for fields, options in (
        ({"language": "fr"}, {"language": "fr"}),
        ({"prompt": "one two"}, {"prompt_ids": torch.tensor(processor.get_prompt_ids("one two"))}),
    ):
        assert ask(**fields).json()["text"] == transcribed(library, heard(data), **options), fields
    translation = httpx.post(
        f"{server.url}/v1/audio/translations", files={"file": ("c.wav", data)}, data={"model": "whisper"}
    )
    assert translation.status_code == 200
    assert translation.json()["text"] == transcribed(library, heard(data), task="translate")


@pytest.mark.parametrize(
    ("fields", "data", "status", "words"),
    [
        ({"model": "whisper-1"}, None, 404, "does not exist"),
        ({"model": "whisper", "response_format": "xml"}, None, 400, "response_format"),
        ({"model": "whisper", "temperature": "3"}, None, 400, "from 0 to 1"),
        ({"model": "whisper", "language": "klingon"}, None, 400, "this model knows"),
        ({"model": "whisper"}, encoded(np.zeros(31 * RATE, np.float32), RATE, "flac"), 413, "up to 30 s"),
        ({"model": "whisper"}, b"%PDF not audio", 415, "not an audio file"),
    ],
)
def test_what_it_cannot_take_is_refused_in_openais_error_body(server, clips, fields, data, status, words):
    body = data if data is not None else encoded(clips[1], RATE, "wav")
    answer = httpx.post(f"{server.url}/v1/audio/transcriptions", files={"file": ("c", body)}, data=fields, timeout=30)
    error = answer.json()["error"]
    assert answer.status_code == status and words in error["message"] and error["code"] == status, answer.text


def test_only_its_routes_are_served(server):
    assert_serves_only_its_routes(server.url, {"POST /v1/audio/transcriptions", "POST /v1/audio/translations"})
