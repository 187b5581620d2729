"""The GPU check's step for the tasks people fine-tune next (issue 56): each exported with parity on the device, then
measured served against its in-process limit there by its benchmark:
- a token classifier, a sentence encoder and a cross-encoder (bench/text_serving.py --task tokens, embed, rerank);
- a Hugging Face ViT with its image processor (bench/workload.py; bench/serve_throughput.py, raw JPEG bodies);
- a Mask R-CNN and a Keypoint R-CNN at 320 px (bench/detection_serving.py: masks pasted and coded in the limit too).
The CPU dry run (CI) keeps it short: it exports the three text models and a 2-layer ViT, and measures the
cross-encoder only (serve_throughput --export is the serving benchmark step's own); the R-CNNs
(tests/test_instances.py exports, serves and checks them) are left to the GPU run.
Each model is built from a config with random weights (seed 0); what their answers are worth is the tests' business
(tests/test_*.py against eager), here only that parity passes on the device and what serving them costs there."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import detection_serving, media_serving, text_serving, workload  # noqa: E402
from bench.results import result_path  # noqa: E402
from contract.manifest import read_manifest_unchecked  # noqa: E402

TEXT_TASKS = ("tokens", "embed", "rerank")
INSTANCE_ARCHS = ("maskrcnn_resnet50_fpn", "keypointrcnn_resnet50_fpn")
SIZES = ("--min-size", "320", "--max-size", "427")  # the R-CNNs' inputs


def _proved(folder: Path, device: str) -> dict[str, Any]:
    """The export's parity by artifact, raising where it did not pass on `device` (an image-text model's: each
    tower's, by tower)."""
    manifest = read_manifest_unchecked(folder)
    parity = manifest["parity"]
    results = [
        {**r, "artifact": f"{tower}/{r['artifact']}"}
        for tower, report in (parity.get("towers") or {"": parity}).items()
        for r in report["results"]
    ]
    results = [{**r, "artifact": r["artifact"].lstrip("/")} for r in results]
    on_device = device != "cuda" or any(r["device"] == "cuda" for r in results)
    if manifest["status"] != "passed" or not on_device:
        raise RuntimeError(f"{manifest['arch']}: parity did not pass on {device}: {parity['summary']}")
    return {"task": manifest["task"], "parity": {r["artifact"]: r["passed"] for r in results}}


def media_on_device(out: Path, device: str, seconds: float, rounds: int, dry_run: bool) -> dict[str, Any]:
    """An AST audio classifier, a CLIP and a Whisper (bench/media_serving.py) exported with parity on `device` and
    measured served against their in-process limit there; the dry run measures the audio classifier only, briefly."""
    measured = {"audio"} if dry_run else set(media_serving.TASKS)
    load = ["--seconds", str(seconds), "--rounds", str(rounds)]

    def make(work: Path, task: str) -> Path:
        return media_serving.make_model(work, task, "--device", device)

    return _proved_and_measured(out, media_serving.TASKS, make, ("media_serving", "c16"), measured, load, device)


def _proved_and_measured(
    out: Path,
    tasks: tuple[str, ...],
    make: Callable[[Path, str], Path],
    bench: tuple[str, str],
    measured: set[str],
    load: list[str],
    device: str,
) -> dict[str, Any]:
    """Each of `tasks` exported by `make(folder, task)` and proved on `device`; those `measured` served by
    `bench`'s (benchmark, concurrency) against their in-process limit, its ratio kept."""
    name, concurrency = bench
    details: dict[str, Any] = {}
    for task in tasks:
        work = out / task
        work.mkdir(parents=True, exist_ok=True)
        folder = make(work, task)
        details[task] = _proved(folder, device)
        if task in measured:
            arguments = ["--task", task, "--export", str(folder), *load]
            ratios = _bench(out, name, arguments, workload.workload_name(folder, task), device)
            details[task][f"ours_over_limit_{concurrency}"] = ratios[f"ours_over_limit_{concurrency}"]
    return details


def _bench(out: Path, name: str, arguments: list[str], workload_name: str, device: str) -> dict[str, float]:
    command = [sys.executable, "-m", "bench", name, "--device", device, "--results-dir", str(out), *arguments]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    (out / f"{name}-{workload_name}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"python -m bench {name} failed ({done.returncode}): {done.stderr[-500:]}")
    return json.loads(result_path(name, device, workload_name, out).read_text())["ratios"]


def tasks_on_device(out: Path, device: str, seconds: float, rounds: int, dry_run: bool) -> dict[str, Any]:
    """Every task's export proved on `device` and its served figures against its limit (`dry_run`: fewer, module
    docstring)."""
    load = ["--seconds", str(seconds), "--rounds", str(rounds)]
    measured = {"rerank"} if dry_run else set(TEXT_TASKS)

    def make(work: Path, task: str) -> Path:
        return text_serving.make_model(work, "--device", device, task=task)

    details = _proved_and_measured(out, TEXT_TASKS, make, ("text_serving", "c64"), measured, load, device)
    folder = workload.make_hf_image_model(out, "--device", device, layers=2 if dry_run else 12)
    details["hf-image"] = _proved(folder, device)
    if not dry_run:
        arguments = ["--export", str(folder), "--sides", "ours_raw_body", *load]
        ratios = _bench(out, "serve_throughput", arguments, workload.workload_name(folder), device)
        details["hf-image"]["ours_over_limit_c64"] = ratios["ours_raw_body_over_limit_c64"]
    for arch in () if dry_run else INSTANCE_ARCHS:
        folder = detection_serving.make_model(out, arch, "--device", device, *SIZES)
        arguments = ["--export", str(folder), *load]
        ratios = _bench(out, "detection_serving", arguments, workload.workload_name(folder), device)
        details[arch] = {**_proved(folder, device), "ours_over_limit_c64": ratios["ours_over_limit_c64"]}
    return details
