"""Served audio classification, image-text embeddings and speech recognition against their in-process limit.

    python -m bench media_serving [--task audio|image-text|speech] [--device cpu|cuda] [--seconds 8] [--rounds 3]
        [--client wrk|httpx]

Models, built from configs with random weights and saved with `save_pretrained`, then exported with no flags:
- `audio`: an Audio Spectrogram Transformer (`ASTForAudioClassification`, hidden 192, 4 layers, 128 mel bins,
  1024 frames: AST's own extractor settings) with its extractor; the clip: a 2 s 44.1 kHz stereo FLAC (tones and
  noise), which the service decodes, mixes, resamples to 16 kHz and turns into filter banks; POST /classify;
- `image-text`: a CLIP (vision tower hidden 256, 4 layers, 224 px, patches of 32; text tower hidden 256, 4 layers)
  with its processor; a 640 x 427 JPEG of scikit-learn's sample photos; POST /embed with the image as the body;
- `speech`: a Whisper of whisper-tiny's size (width 384, 4 encoder and 4 decoder layers, 80 mel bins) over a small
  BPE vocabulary with Whisper's special tokens, its generation config as the fine-tuning recipe leaves it but
  `max_length` 24 and the timestamps suppressed (random weights seldom end a text: every request decodes 24 tokens,
  the most `generate` would); a 5 s clip of spoken tones
  as a 16 kHz FLAC; POST /v1/audio/transcriptions with the file as the body. Its real-time factor (seconds of
  work per second of audio, one request alone) is reported besides.
Sides, each given the whole machine in turn:
- limit: no HTTP: the same work the service does for a request (contract/audio.py's decode and
  contract/audio_features.py's filter banks, or contract/pil_transform.py's decode and preprocessing) and the ONNX
  Runtime session (the service's settings) on batches of 1, 4 and 16, each batch's files prepared by a thread per
  core, then run, or prepared so while the model runs the batch before (as the service's decoding threads work
  beside its model thread); the fastest timed again for --seconds;
- ours: `bentoml serve` with serve/service.py, one file per request.
Goal (issue 75): ours at c=16 at least 0.8 x the limit.
The limit's work for a batch of speech is the service's: the encoder on the batch, then the decoder a token at a time
on every row (contract/speech.py).
"""

from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.checks import assert_provider  # noqa: E402
from bench.load import Upload, load_levels, wrk_available  # noqa: E402
from bench.results import median_of_rounds, print_goal, print_ratios  # noqa: E402
from bench.serving import (  # noqa: E402
    measure_rounds,
    over_limit,
    paired_over_limit,
    print_sides,
    served_provider,
    write_serving_result,
)
from bench.text_serving import zen_words  # noqa: E402
from contract.audio import decode_audio  # noqa: E402
from contract.audio_features import FEATURE_TABLES, AudioFeatures  # noqa: E402
from contract.manifest import Manifest, read_manifest_unchecked  # noqa: E402
from contract.pil_transform import Preprocessor  # noqa: E402
from contract.speech import SpeechSettings  # noqa: E402
from harness.audio_files import WORD_PITCHES, encoded, spoken, tone  # noqa: E402
from harness.server import BentoServer  # noqa: E402
from harness.tiny_text import (  # noqa: E402
    whisper_config,
    whisper_generation_config,
    whisper_tokenizer,
    wordpiece_tokenizer,
)
from serve.config import usable_cores  # noqa: E402
from serve.model.runtime import onnx_providers, onnx_session_options  # noqa: E402

CONCURRENCY = (1, 16)
BATCH_SIZES = (1, 4, 16)
GOAL = "ours >= 0.8 x limit at c=16"
TASKS = ("audio", "image-text", "speech")
ROUTES = {"audio": "/classify", "image-text": "/embed", "speech": "/v1/audio/transcriptions"}
SPEECH_SECONDS = 5.0
RATE = 16_000


def make_audio_model(folder: Path) -> Path:
    import transformers

    config = transformers.ASTConfig(  # type: ignore[call-arg]
        hidden_size=192, num_hidden_layers=4, num_attention_heads=3, intermediate_size=768, num_labels=3
    )
    saved = folder / "ast"
    transformers.ASTForAudioClassification(config).save_pretrained(saved)
    transformers.ASTFeatureExtractor().save_pretrained(saved)
    return saved


def make_image_text_model(folder: Path) -> Path:
    import transformers

    tokenizer = wordpiece_tokenizer(zen_words(), vocab_size=400, max_length=64)
    text = {"vocab_size": len(tokenizer), "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4}
    text |= {"num_attention_heads": 4, "max_position_embeddings": 64, "pad_token_id": tokenizer.pad_token_id}
    text |= {"bos_token_id": tokenizer.cls_token_id, "eos_token_id": tokenizer.sep_token_id}
    vision = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 4}
    vision |= {"image_size": 224, "patch_size": 32}
    config = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=128)
    saved = folder / "clip"
    transformers.CLIPModel(config).save_pretrained(saved)
    transformers.CLIPProcessor(image_processor=transformers.CLIPImageProcessor(), tokenizer=tokenizer).save_pretrained(
        saved
    )
    return saved


def make_speech_model(folder: Path) -> Path:
    import transformers

    words = [" ".join(WORD_PITCHES)] * 4
    tokenizer = whisper_tokenizer(words + [" " + " ".join(zen_words()[:200])])
    model = transformers.WhisperForConditionalGeneration(whisper_config(tokenizer, 384, 4, 6))
    model.generation_config = whisper_generation_config(tokenizer, max_length=24, quiet_timestamps=True)
    saved = folder / "whisper"
    model.save_pretrained(saved)
    transformers.WhisperProcessor(
        feature_extractor=transformers.WhisperFeatureExtractor(), tokenizer=tokenizer
    ).save_pretrained(saved)
    return saved


def make_model(folder: Path, task: str, *export_flags: str) -> Path:
    """`task`'s model saved in `folder` as a user would, exported with no flags (or `export_flags`); its export."""
    makers = {"audio": make_audio_model, "image-text": make_image_text_model, "speech": make_speech_model}
    saved = makers[task](folder)
    out = saved.with_suffix(".export")
    command = [sys.executable, "-m", "export", str(saved), "--formats", "onnx", "--out", str(out), "--no-bento"]
    command += export_flags
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"python -m export {saved} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return out


def request_body(task: str) -> tuple[bytes, str]:
    """The file each request sends, and its media type."""
    if task == "speech":
        rng = np.random.default_rng(0)
        words = list(rng.choice(list(WORD_PITCHES), int(SPEECH_SECONDS / 0.383)))
        return encoded(spoken(words, rng)[: int(SPEECH_SECONDS * RATE)], RATE, "flac"), "audio/flac"
    if task == "audio":
        rng = np.random.default_rng(0)
        left = tone(440, 2.0, 44_100) + 0.05 * rng.standard_normal(88_200).astype(np.float32)
        return encoded(np.stack([left, tone(660, 2.0, 44_100)], axis=1), 44_100, "flac"), "audio/flac"
    from PIL import Image
    from sklearn.datasets import load_sample_images

    buffer = io.BytesIO()
    Image.fromarray(load_sample_images().images[1]).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue(), "image/jpeg"


class InProcess:
    """What the service does for one request, without HTTP: the file decoded and made the model's row, and the
    session (the task's own, with the service's settings) on batches of rows."""

    def __init__(self, task: str, folder: Path, device: str) -> None:
        import onnxruntime as ort

        manifest = read_manifest_unchecked(folder)
        model = {"audio": "model.onnx", "image-text": "image/model.onnx", "speech": "encoder/model.onnx"}[task]
        self.session = ort.InferenceSession(
            str(folder / model), onnx_session_options(), providers=onnx_providers(device)
        )
        assert_provider("limit", self.session.get_providers(), device)
        self.input = self.session.get_inputs()[0].name
        self.preparing = ThreadPoolExecutor(1)  # the next batch, while the model runs
        self.decoders = ThreadPoolExecutor(usable_cores())
        self.prepare: Callable[[bytes], np.ndarray]
        self.speech: Callable[[dict[str, np.ndarray]], None] | None = None
        if task == "speech":
            self.speech = decoding(folder, manifest, device)
        if task in ("audio", "speech"):
            features = AudioFeatures.from_manifest(manifest["audio"], (folder / FEATURE_TABLES).read_bytes())
            self.prepare = lambda data: features(decode_audio(data, features.sampling_rate, 600).waveform)
        else:
            pixels = Preprocessor.from_manifest(manifest["preprocess"], 40_000_000)
            self.prepare = lambda data: pixels(pixels.decode(data))

    def run(self, batches: list[list[bytes]]) -> None:
        """Each batch prepared, then run."""
        for batch in batches:
            self.call(self.rows(batch))

    def call(self, rows: np.ndarray) -> None:
        """The model on a batch of rows: a speech model's encoder, then its decoding."""
        outputs = self.session.run(None, {self.input: rows})
        if self.speech is not None:
            self.speech(dict(zip(("cross_keys", "cross_values"), outputs, strict=True)))

    def run_ahead(self, batches: list[list[bytes]]) -> None:
        """Each batch prepared a batch ahead, in a thread, while the model runs the one before."""
        ahead = self.preparing.submit(self.rows, batches[0])
        for index in range(len(batches)):
            rows = ahead.result()
            if index + 1 < len(batches):
                ahead = self.preparing.submit(self.rows, batches[index + 1])
            self.call(rows)

    def rows(self, batch: list[bytes]) -> np.ndarray:
        """A batch's files prepared by a thread per core, as the service's decoding threads prepare them."""
        return np.stack(list(self.decoders.map(self.prepare, batch)))


def decoding(folder: Path, manifest: Manifest, device: str) -> Callable[[dict[str, np.ndarray]], None]:
    """A Whisper's decoding on the encoder's states, as the service decodes (contract/speech.py)."""
    import onnxruntime as ort

    settings = SpeechSettings.from_manifest(manifest["speech"])
    session = ort.InferenceSession(
        str(folder / "decoder" / "model.onnx"), onnx_session_options(), providers=onnx_providers(device)
    )
    prompt = settings.prompt(settings.language, settings.task, None)

    def decode(cross: dict[str, np.ndarray]) -> None:
        def logits(ids: np.ndarray) -> np.ndarray:
            return session.run(None, {"input_ids": ids, **cross})[0]

        settings.decode(logits, prompt, len(cross["cross_keys"]))

    return decode


def rate(run: Callable[[list[list[bytes]]], None], body: bytes, size: int, count: int) -> float:
    batches = [[body] * size for _ in range(max(1, count // size))]
    run(batches[:1])  # warm this batch size
    started = time.perf_counter()
    run(batches)
    return sum(map(len, batches)) / (time.perf_counter() - started)


def limit_round(model: InProcess, body: bytes, seconds: float) -> dict[str, Any]:
    arrangements = {f"batch {size}": (model.run, size) for size in BATCH_SIZES}
    arrangements |= {f"batch {size}, prepared ahead": (model.run_ahead, size) for size in BATCH_SIZES}
    swept = {name: rate(run, body, size, 32) for name, (run, size) in arrangements.items()}
    best = max(swept, key=swept.__getitem__)
    run, size = arrangements[best]
    single = []
    for _ in range(15):
        started = time.perf_counter()
        model.run([[body]])
        single.append(time.perf_counter() - started)
    return {
        "images_per_s": rate(run, body, size, int(swept[best] * seconds)),
        "best": best,
        "swept": {name: round(value, 1) for name, value in swept.items()},
        "single_image_ms": 1000 * statistics.median(single),
    }


def measure(folder: Path, device: str, log: Path, uploads: list[Upload], args: Any) -> dict[str, Any]:
    with BentoServer(
        log, target=None, cwd=ROOT, bentoml=None, HANDOFF_MODEL_DIR=str(folder), HANDOFF_DEVICE=device
    ) as s:
        result: dict[str, Any] = {"ready_s": s.wait_ready()}
        assert_provider("ours", [served_provider("ours", s.url)], device)
        result.update(load_levels(args.client, s.url, s.proc.pid, uploads, CONCURRENCY, args.seconds))
        return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=TASKS, default="audio", help="the model (module docstring)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--seconds", type=float, default=8.0, help="load per concurrency level, side and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--client", choices=("wrk", "httpx"), default="wrk" if wrk_available() else "httpx")
    p.add_argument("--export", type=Path, help="serve this export instead of a fresh model (of --task's kind)")
    p.add_argument("--results-dir", type=Path, default=None, help="where the JSON goes (default: bench/results)")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="media-bench-"))
    folder = args.export.resolve() if args.export else make_model(work, args.task)
    body, media_type = request_body(args.task)
    route = ROUTES[args.task]
    uploads = [Upload(route, {"Content-Type": media_type}, body)]
    model = InProcess(args.task, folder, args.device)
    rounds = measure_rounds(
        args.rounds,
        ["ours"],
        lambda: limit_round(model, body, args.seconds),
        lambda name, round_, _: measure(folder, args.device, work / f"{name}{round_}.log", uploads, args),
        unit="files",
        shown="16",
    )
    median = median_of_rounds(rounds)
    limit = median["limit"]
    print(
        f"limit (in-process, median of {args.rounds} rounds): {limit['images_per_s']:.1f} files/s; "
        f"one file alone {limit['single_image_ms']:.1f} ms; best per round: "
        f"{', '.join(r['limit']['best'] for r in rounds)}"
    )
    print_sides(median, ["ours"], CONCURRENCY, unit="files")
    ratios = over_limit(median, ["ours"], CONCURRENCY)
    print_ratios(ratios)
    goal = ratios["ours_over_limit_c16"] >= 0.8
    print_goal(GOAL, goal)
    figures = {"client": args.client, "task": f"{args.task} ({route})", "file": f"{media_type}, {len(body)} bytes"}
    figures |= paired_over_limit(rounds, ["ours"], at="16")
    seconds = {"limit_one_file": limit["single_image_ms"] / 1000, "ours_p50_c1": median["ours"]["1"]["p50_ms"] / 1000}
    if args.task == "speech":  # seconds of work per second of audio, one request alone
        figures["real-time factor, served alone (p50 at c=1 / audio seconds)"] = round(
            seconds["ours_p50_c1"] / SPEECH_SECONDS, 3
        )
        figures["real-time factor, in-process alone"] = round(seconds["limit_one_file"] / SPEECH_SECONDS, 3)
        print(
            f"real-time factor: served {figures['real-time factor, served alone (p50 at c=1 / audio seconds)']}, "
            f"in-process {figures['real-time factor, in-process alone']} (a {SPEECH_SECONDS:g} s clip)"
        )
    report = {"ratios": ratios, "seconds": seconds, "figures": figures, "goal": GOAL, "goal_met": goal}
    write_serving_result("media_serving", args, rounds, median, ["ours"], report, args.task)
    return 0


if __name__ == "__main__":
    sys.exit(main())
