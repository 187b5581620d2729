"""Served detection against the in-process limit for the same images, side by side.

    python bench/detection_serving.py [--device cpu|cuda] [--seconds 8] [--rounds 3] [--client wrk|httpx]
        [--arch fasterrcnn_mobilenet_v3_large_320_fpn] [--min-size N --max-size N] [--export DIR]

Model: a torchvision detector (default fasterrcnn_mobilenet_v3_large_320_fpn, 3 classes, random weights from seed
0; maskrcnn_resnet50_fpn, keypointrcnn_resnet50_fpn with --min-size 320 --max-size 427 to keep a CPU run short), its
state_dict exported by `python -m export --arch` (or --export DIR: any detector or segmenter export).
Images: bench/workload.py's 32 views of scikit-learn's photos, 400 x 300 JPEGs, one per request, as the body.
Sides, each given the whole machine in turn:
- limit: no HTTP: the service's own decoding (serve/tasks/object_detection.py's prepare, or the segmenter's), the
  ONNX Runtime session with the service's settings, one image per call as the service runs them, and a detector's
  answer (its masks pasted and run-length coded, for Mask R-CNN); the faster of serial (decode, run, answer) and
  overlapped (a thread per core decodes the next images while the model runs);
- ours: `bentoml serve` with serve/service.py, `POST /detect` (or /segment) with the JPEG as the body.
Goal (issue 44): ours at c=64 at least 0.8 x the limit.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

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
from bench.workload import make_jpegs  # noqa: E402
from contract.manifest import read_manifest_unchecked  # noqa: E402
from contract.signature import TASK_OBJECT_DETECTION  # noqa: E402
from harness.server import BentoServer  # noqa: E402
from serve.config import ServeConfig, usable_cores  # noqa: E402
from serve.model.decode_pool import DecodePool  # noqa: E402
from serve.model.runtime import load_runtime, onnx_providers, onnx_session_options  # noqa: E402
from serve.tasks import Serving, task_for  # noqa: E402

CONCURRENCY = (1, 64)
GOAL = "ours >= 0.8 x limit at c=64"


DEFAULT_ARCH = "fasterrcnn_mobilenet_v3_large_320_fpn"


def make_model(folder: Path, arch: str, *export_flags: str) -> Path:
    import torch
    import torchvision

    torch.manual_seed(0)
    weights = folder / f"{arch}.pt"
    classes = 2 if arch.startswith("keypointrcnn") else 3
    torch.save(
        torchvision.models.get_model(arch, weights=None, weights_backbone=None, num_classes=classes).state_dict(),
        weights,
    )
    out = folder / f"{arch}.export"
    command = [sys.executable, "-m", "export", str(weights), "--arch", arch, "--formats", "onnx", "--out", str(out)]
    done = subprocess.run([*command, "--no-bento", *export_flags], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"python -m export {weights} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return out


class InProcessImages:
    """The export's task model (its decoding) and ONNX session, loaded the way the service loads them."""

    def __init__(self, folder: Path, device: str) -> None:
        import onnxruntime as ort

        manifest = read_manifest_unchecked(folder)
        self.route = "/detect" if manifest["task"] == TASK_OBJECT_DETECTION else "/segment"
        # the service's own task, for its decoding: built as the service builds it (its batched calls unused here)
        config = dataclasses.replace(ServeConfig(), max_pixels=10**8)
        runtime = load_runtime("onnx", folder, manifest, device)
        self.task: Any = task_for(manifest)(Serving(manifest, folder, runtime, config, DecodePool(1), self._unbatched))
        self.session = ort.InferenceSession(
            str(folder / "model.onnx"), onnx_session_options(), providers=onnx_providers(device)
        )
        assert_provider("limit", self.session.get_providers(), device)
        self.names = [output.name for output in self.session.get_outputs()]
        self.pool = ThreadPoolExecutor(usable_cores())

    async def _unbatched(self, rows: Any) -> dict[str, Any]:
        return self.task.run(rows)

    def prepare(self, jpeg: bytes) -> tuple[dict[str, Any], Any]:
        prepared = self.task.prepare(jpeg)
        return prepared if isinstance(prepared, tuple) else (prepared, None)

    def run(self, rows: dict[str, Any], frame: Any) -> None:
        outputs = self.session.run(None, rows)
        if self.route == "/detect":  # the answer: boxes in the upload's pixels, masks pasted and coded
            self.task.detections(dict(zip(self.names, outputs, strict=True)), frame)

    def serial(self, jpegs: list[bytes]) -> None:
        for jpeg in jpegs:
            self.run(*self.prepare(jpeg))

    def overlapped(self, jpegs: list[bytes]) -> None:
        for rows, frame in self.pool.map(self.prepare, jpegs):  # decodes run ahead on the pool while each runs
            self.run(rows, frame)


def _rate(run: Any, jpegs: list[bytes], count: int) -> dict[str, float]:
    images = [jpegs[i % len(jpegs)] for i in range(count)]
    run(images[:2])  # warm
    wall, cpu = time.perf_counter(), time.process_time()
    run(images)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"images_per_s": count / wall, "cpu_ms_per_image": 1000 * cpu / count}


def limit_round(model: InProcessImages, jpegs: list[bytes], seconds: float) -> dict[str, Any]:
    """Both arrangements on 16 images, the faster timed again for `seconds`, and one image alone."""
    arrangements = {"serial": model.serial, "overlapped": model.overlapped}
    swept = {name: _rate(run, jpegs, 16) for name, run in arrangements.items()}
    best = max(swept, key=lambda name: swept[name]["images_per_s"])
    limit = _rate(arrangements[best], jpegs, max(16, int(swept[best]["images_per_s"] * seconds)))
    single = []
    for i in range(10):
        started = time.perf_counter()
        model.serial([jpegs[i % len(jpegs)]])
        single.append(time.perf_counter() - started)
    return {**limit, "best": best, "single_image_ms": 1000 * statistics.median(single)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--seconds",
        type=float,
        default=8.0,
        help="load per concurrency level and round (at least 2.5 x the time "
        "the queue at c=64 takes to drain at the limit's rate)",
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--client", choices=("wrk", "httpx"), default="wrk" if wrk_available() else "httpx")
    p.add_argument(
        "--drains",
        type=float,
        default=2.5,
        help="each window at least this many times the queue's drain at c=64 "
        "(0: --seconds alone, for a check that the benchmark runs)",
    )
    p.add_argument("--arch", default=DEFAULT_ARCH, help="the detector to export")
    p.add_argument("--min-size", type=int, help="the export's --min-size (the detector's resize target)")
    p.add_argument("--max-size", type=int, help="the export's --max-size")
    p.add_argument("--export", type=Path, help="serve this detector or segmenter export instead")
    p.add_argument("--results-dir", type=Path, default=None, help="where the JSON goes (default: bench/results)")
    p.add_argument(
        "--retry-after",
        action="store_true",
        help="clients wait as a 503's Retry-After says before sending again (default: at once); a model slower "
        "than the c=64 queue's budget (HANDOFF_MAX_LATENCY_MS) refuses most of them either way",
    )
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="detection-bench-"))
    sizes = [f"--{side}-size={value}" for side, value in (("min", args.min_size), ("max", args.max_size)) if value]
    folder = args.export.resolve() if args.export else make_model(work, args.arch, *sizes)
    jpegs = make_jpegs()
    model = InProcessImages(folder, args.device)
    requests = [Upload(model.route, {"Content-Type": "image/jpeg"}, jpeg) for jpeg in jpegs]

    def ours(name: str, round_: int, this_round: dict[str, Any]) -> dict[str, Any]:
        # A window shorter than the queue at c=64 takes to drain measures the ramp, not the rate (a segmenter at
        # 8 images/s: 64 queued for 8 s; a 6 s window read 0.58 x, a 20 s one 0.92 x): --drains of it at least.
        drained = args.drains * max(CONCURRENCY) / this_round["limit"]["images_per_s"]
        window = max(args.seconds, math.ceil(drained))
        env = {"HANDOFF_MODEL_DIR": str(folder), "HANDOFF_DEVICE": args.device}
        with BentoServer(work / f"ours{round_}.log", **env) as server:
            ready = server.wait_ready()
            assert_provider("ours", [served_provider("ours", server.url)], args.device)
            levels = load_levels(
                args.client, server.url, server.proc.pid, requests, CONCURRENCY, window, args.retry_after
            )
            return {"ready_s": ready, "window_s": window, **levels}

    rounds = measure_rounds(args.rounds, ["ours"], lambda: limit_round(model, jpegs, args.seconds), ours)
    median = median_of_rounds(rounds)
    limit = median["limit"]
    print(
        f"limit (in-process, median of {args.rounds} rounds): {limit['images_per_s']:.2f} images/s; "
        f"one image {limit['single_image_ms']:.1f} ms; best per round: {', '.join(r['limit']['best'] for r in rounds)}"
    )
    print_sides(median, ["ours"], CONCURRENCY)
    ratios = over_limit(median, ["ours"], CONCURRENCY)
    print_ratios(ratios)
    paired = paired_over_limit(rounds, ["ours"])
    goal = ratios["ours_over_limit_c64"] >= 0.8
    print_goal(GOAL, goal)
    seconds = {"limit_one_image": limit["single_image_ms"] / 1000, "ours_p50_c1": median["ours"]["1"]["p50_ms"] / 1000}
    figures = {
        "client": args.client,
        "model": read_manifest_unchecked(folder)["arch"],
        "images": "32 views of scikit-learn's photos, 400 x 300 JPEG",
        "clients_wait_retry_after": args.retry_after,
        **paired,
    }
    report = {"ratios": ratios, "seconds": seconds, "figures": figures, "goal": GOAL, "goal_met": goal}
    variant = "" if args.export or args.arch == DEFAULT_ARCH else args.arch
    polite = "retry-after" if args.retry_after else ""
    write_serving_result("detection_serving", args, rounds, median, ["ours"], report, variant, polite)
    return 0


if __name__ == "__main__":
    sys.exit(main())
