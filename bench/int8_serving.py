"""INT8 against fp32, served: the same JPEG workload, client and service, only HANDOFF_PRECISION differs.

    python bench/int8_serving.py [--seconds 8] [--rounds 3] [--client wrk|httpx]

Model: resnet18 at 224 px, random weights, exported with --int8 (calibrated on 64 JPEG views of
scikit-learn's sample photos, checked on 64 others). Rounds are interleaved (fp32, int8, fp32, ...), so
drift of the machine hits both alike, and only one service runs at a time (an idle BentoML service still
takes CPU, which showed as 4x the fp32 latency at concurrency 1 when both ran); medians of rounds. Beside it:
each precision's in-process limit (bench/limit.py) in every round, and the accuracy delta on the digits
validation set (a resnet18 trained 3 epochs on the digits, exported with --int8: fp32 vs INT8 top-1 over all
360 images).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.limit import InProcessModel, limit_round  # noqa: E402
from bench.load import load_levels, uploads, wrk_available  # noqa: E402
from bench.results import median_of_rounds, print_goal, print_ratios, write_result  # noqa: E402
from bench.serve_throughput import CONCURRENCY  # noqa: E402
from bench.workload import make_int8_model, make_jpegs  # noqa: E402
from contract.manifest import read_manifest_unchecked  # noqa: E402
from harness.server import BentoServer  # noqa: E402

GOAL = "served INT8 >= 2 x served fp32 at concurrency 64, at most 1 point of top-1 lost on the digits"


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=8.0, help="load per concurrency level, precision and round")
    p.add_argument("--client", choices=("wrk", "httpx"), default="wrk" if wrk_available() else "httpx")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--results-dir", type=Path, default=None)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="int8-bench-"))
    folder = make_int8_model(work)
    jpegs = make_jpegs()
    models = {
        p: InProcessModel(folder, "cpu", name) for p, name in (("fp32", "model.onnx"), ("int8", "model.int8.onnx"))
    }
    rounds: list[dict] = []
    for round_ in range(args.rounds):
        figures: dict = {}
        for precision in ("fp32", "int8"):
            figures[f"{precision}_limit"] = limit_round(models[precision], jpegs, args.seconds)
            with BentoServer(
                work / f"{precision}{round_}.log", HANDOFF_MODEL_DIR=str(folder), HANDOFF_PRECISION=precision
            ) as server:
                server.wait_ready()
                figures[precision] = load_levels(
                    args.client, server.url, server.proc.pid, uploads(jpegs), CONCURRENCY, args.seconds
                )
        rounds.append(figures)
    median = median_of_rounds(rounds)
    served = {precision: median[precision] for precision in ("fp32", "int8")}
    limits = {precision: median[f"{precision}_limit"] for precision in ("fp32", "int8")}
    accuracy = digits_accuracy(work)
    ratios = {
        f"int8_over_fp32_served_c{c}": served["int8"][str(c)]["images_per_s"] / served["fp32"][str(c)]["images_per_s"]
        for c in CONCURRENCY
    }
    ratios["int8_over_fp32_limit"] = limits["int8"]["images_per_s"] / limits["fp32"]["images_per_s"]
    for c in CONCURRENCY:
        for precision in ("fp32", "int8"):
            r = served[precision][str(c)]
            print(
                f"{precision} c={c:<3} {r['images_per_s']:6.1f} images/s  p50 {r['p50_ms']:7.1f} ms  "
                f"p99 {r['p99_ms']:7.1f} ms  errors {r['errors']:.0f}"
            )
    print(
        f"in-process limit: fp32 {limits['fp32']['images_per_s']:.1f}, "
        f"int8 {limits['int8']['images_per_s']:.1f} images/s"
    )
    print_ratios(ratios)
    print(
        f"digits validation top-1: fp32 {accuracy['fp32_top1']:.2f}%, int8 {accuracy['int8_top1']:.2f}% "
        f"(drop {accuracy['drop']:.2f} points)"
    )
    goal = ratios["int8_over_fp32_served_c64"] >= 2 and accuracy["drop"] <= 1
    print_goal(GOAL, goal)
    write_result(
        "int8_serving",
        folder=args.results_dir,
        figures={
            "device": "cpu",
            "rounds": args.rounds,
            "client": args.client,
            "limits": limits,
            "served": served,
            "ratios": ratios,
            "digits_accuracy": accuracy,
            "seconds": {f"{p}_p50_c{c}": served[p][str(c)]["p50_ms"] / 1000 for p in served for c in CONCURRENCY},
            "goal": GOAL,
            "goal_met": goal,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
