"""INT8 against fp32, served: the same JPEG workload, client and service, only HANDOFF_PRECISION differs.

    python bench/int8_serving.py [--requests 300] [--rounds 3]

Model: resnet18 at 224 px, random weights, exported with --int8 (calibrated on 64 JPEG views of
scikit-learn's sample photos, checked on 64 others). Rounds are interleaved (fp32, int8, fp32, ...), so
drift of the machine hits both alike, and only one service runs at a time (an idle BentoML service still
takes CPU, which showed as 4x the fp32 latency at concurrency 1 when both ran); medians of rounds. Beside it:
each precision's in-process limit, and the accuracy delta on the digits validation set (a resnet18 trained
3 epochs on the digits, exported with --int8: fp32 vs INT8 top-1 over all 360 images).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.results import write_result  # noqa: E402
from bench.serve_throughput import CONCURRENCY, load, make_jpegs, make_model, measure_limit, write_jpegs  # noqa: E402
from export.manifest import read_manifest_unchecked  # noqa: E402
from harness.server import BentoServer  # noqa: E402


def digits_accuracy(work: Path) -> dict:
    run = work / "digits"
    subprocess.run(
        [sys.executable, str(ROOT / "train" / "main.py"), "--epochs", "3", "--workers", "0", "--out", str(run)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [sys.executable, "-m", "export", str(run / "last.pt"), "--formats", "onnx", "--int8", "--no-bento"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return read_manifest_unchecked(run / "last.export")["int8"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=300, help="requests per concurrency level and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--results-dir", type=Path, default=None)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="int8-bench-"))
    samples = write_jpegs(work / "samples", 128)
    folder = make_model(work, "--int8", "--samples", str(samples), "--max-accuracy-drop", "100")
    jpegs = make_jpegs()
    limits = {
        precision: measure_limit(folder, jpegs, "cpu", model_file=name)
        for precision, name in (("fp32", "model.onnx"), ("int8", "model.int8.onnx"))
    }
    runs: dict[str, dict[int, list[dict]]] = {
        "fp32": {c: [] for c in CONCURRENCY},
        "int8": {c: [] for c in CONCURRENCY},
    }
    for round_ in range(args.rounds):
        for precision in ("fp32", "int8"):
            with BentoServer(
                work / f"{precision}{round_}.log", HANDOFF_MODEL_DIR=str(folder), HANDOFF_PRECISION=precision
            ) as server:
                server.wait_ready()
                for c in CONCURRENCY:
                    n = args.requests if c > 1 else max(50, args.requests // 4)
                    runs[precision][c].append(asyncio.run(load(server.url, jpegs, c, n)))
    served = {
        precision: {c: {k: statistics.median(r[k] for r in rounds) for k in rounds[0]} for c, rounds in by_c.items()}
        for precision, by_c in runs.items()
    }
    accuracy = digits_accuracy(work)
    ratios = {
        f"int8_over_fp32_served_c{c}": served["int8"][c]["images_per_s"] / served["fp32"][c]["images_per_s"]
        for c in CONCURRENCY
    }
    ratios["int8_over_fp32_limit"] = limits["int8"]["images_per_s"] / limits["fp32"]["images_per_s"]
    for c in CONCURRENCY:
        for precision in ("fp32", "int8"):
            r = served[precision][c]
            print(
                f"{precision} c={c:<3} {r['images_per_s']:6.1f} images/s  p50 {r['p50_ms']:7.1f} ms  "
                f"p99 {r['p99_ms']:7.1f} ms  errors {r['errors']:.0f}"
            )
    print(
        f"in-process limit: fp32 {limits['fp32']['images_per_s']:.1f}, "
        f"int8 {limits['int8']['images_per_s']:.1f} images/s"
    )
    for key, value in ratios.items():
        print(f"  {key:<28} {value:5.2f} x")
    print(
        f"digits validation top-1: fp32 {accuracy['fp32_top1']:.2f}%, int8 {accuracy['int8_top1']:.2f}% "
        f"(drop {accuracy['drop']:.2f} points)"
    )
    goal = ratios["int8_over_fp32_served_c64"] >= 2 and accuracy["drop"] <= 1
    print(f"goal (served INT8 >= 2 x fp32 at c=64, <= 1 point lost): {'met' if goal else 'NOT met'}")
    write_result(
        "int8_serving_cpu",
        folder=args.results_dir,
        figures={
            "device": "cpu",
            "limits": limits,
            "served": {p: {str(c): r for c, r in s.items()} for p, s in served.items()},
            "ratios": ratios,
            "digits_accuracy": accuracy,
            "median_seconds": {f"{p}_p50_c{c}": served[p][c]["p50_ms"] / 1000 for p in served for c in CONCURRENCY},
            "goal": "served INT8 >= 2 x served fp32 at concurrency 64, at most 1 point of top-1 lost on the digits",
            "goal_met": goal,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
