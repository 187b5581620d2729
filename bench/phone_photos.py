"""Phone-size photos: 12-megapixel JPEGs served with the exact decode and with the fast (draft) one, side by side.

    python bench/phone_photos.py [--rounds 3] [--seconds 8] [--precision fp32|int8] [--export FOLDER]

Model: resnet18 at 224 px (resize 256), exported by `python -m export`, whose decode check decides whether
the fast path may be used; with --precision int8, exported with --int8 (calibrated on 128 JPEG views of
scikit-learn's photos) and served INT8 on both sides, where the model costs less and the decode decides more
of the ratio; with --export, that export (e.g. `make demo`'s digits model at 32 px, where the decode is nearly
the whole cost). Images: scikit-learn's sample photos scaled to 4032 x 3024 (a 12-megapixel phone
photo's size) and cut into varied views of that size, as JPEG (quality 90, 0.7-1.4 MB each). Sides, one server at
a time, alternating each round: HANDOFF_DECODE=exact and HANDOFF_DECODE=auto, both sent the JPEG as the body
at c=1 and c=64 (bench/load.py). Reported: images/s and p50 (medians of rounds), server CPU per image, the ratio
auto / exact at c=64 (goal: at least 5x), and the decode check the export recorded (top-1 agreement, goal at
least 99.5%).

The honest limit beside it, measured in each round: the same photos in process, decoded in a pool of one thread
per core while the model runs batches of 32 (bench/limit.py), exactly and the fast way; their ratio is the most
any server could gain on this machine. The JPEG's entropy decoding stays whole at every DCT scale, so where the
model costs much more than the fast decode that ceiling sits below 5 x whatever the server does.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.limit import InProcessModel, overlapped_limit  # noqa: E402
from bench.load import load_levels, uploads, wrk_available  # noqa: E402
from bench.results import median_of_rounds, print_goal, write_result  # noqa: E402
from bench.workload import PHONE_PHOTO_SIZE, make_int8_model, make_model, phone_photos, workload_name  # noqa: E402
from contract.manifest import fast_decode_checked, read_manifest  # noqa: E402
from harness.server import BentoServer  # noqa: E402

CONCURRENCY = (1, 8, 64)
GOAL = "12-megapixel JPEGs at c=64: auto (fast decode) >= 5 x exact per image; top-1 agreement >= 99.5%"


def in_process_limits(model: InProcessModel, photos: list[bytes]) -> dict[str, dict[str, float]]:
    """The in-process limit with each decode: the photos decoded in a pool of one thread per core while the model
    runs batches of 32 (bench/limit.py's overlapped arrangement)."""
    limits = {}
    for decode, images in (("exact", 64), ("auto", 128)):
        model.fast_decode = decode == "auto"
        limits[decode] = overlapped_limit(model, photos, images)
    return limits


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--client", choices=("wrk", "httpx"), default="wrk" if wrk_available() else "httpx")
    p.add_argument("--precision", choices=("fp32", "int8"), default="fp32", help="the model both sides serve")
    p.add_argument("--export", type=Path, help="serve this export folder instead of a fresh resnet18 at 224 px")
    p.add_argument("--results-dir", type=Path, default=None)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="phone-photos-"))
    if args.export:
        folder = args.export.resolve()
    else:
        folder = make_int8_model(work) if args.precision == "int8" else make_model(work)
    manifest = read_manifest(folder)
    crop = manifest["preprocess"]["crop"]
    check = fast_decode_checked(manifest) or {}
    photos = phone_photos()
    requests = uploads(photos, "raw")
    model = InProcessModel(folder, "cpu", "model.int8.onnx" if args.precision == "int8" else "model.onnx")
    rounds, limits = [], []
    for round_ in range(args.rounds):
        limits.append(in_process_limits(model, photos))
        figures = {}
        for decode in ("exact", "auto") if round_ % 2 == 0 else ("auto", "exact"):
            log = work / f"{decode}{round_}.log"
            env = {"HANDOFF_MODEL_DIR": str(folder), "HANDOFF_DECODE": decode, "HANDOFF_PRECISION": args.precision}
            with BentoServer(log, **env) as server:
                server.wait_ready()
                figures[decode] = load_levels(
                    args.client, server.url, server.proc.pid, requests, CONCURRENCY, args.seconds
                )
        rounds.append(figures)
        print(
            f"round {round_ + 1}: "
            + ", ".join(f"{d} c=64 {figures[d]['64']['images_per_s']:.1f}" for d in figures)
            + ", in process "
            + ", ".join(f"{d} {limits[-1][d]['images_per_s']:.1f}" for d in figures)
            + " images/s"
        )
    median = median_of_rounds(rounds)
    for decode in ("exact", "auto"):
        for c in map(str, CONCURRENCY):
            r = median[decode][c]
            print(
                f"{decode:<6} c={c:<3} {r['images_per_s']:6.2f} images/s  p50 {r['p50_ms']:8.1f} ms  "
                f"server CPU {r['server_cpu_ms_per_image']:6.1f} ms/image"
            )
    by_round = [r["auto"]["64"]["images_per_s"] / r["exact"]["64"]["images_per_s"] for r in rounds]
    speedup = statistics.median(by_round)  # paired: each round's two sides ran back to back
    ceilings = [limit["auto"]["images_per_s"] / limit["exact"]["images_per_s"] for limit in limits]
    ceiling = statistics.median(ceilings)
    agreement = check.get("top1_agreement")
    print(f"auto / exact at c=64: {speedup:.2f} x, median of rounds ({', '.join(f'{x:.2f}' for x in by_round)})")
    print(f"in process (the ceiling): {ceiling:.2f} x, median of rounds ({', '.join(f'{x:.2f}' for x in ceilings)})")
    print(f"decode check at export: {check}")
    met = speedup >= 5 and agreement is not None and agreement >= 0.995
    print_goal(GOAL, met)
    write_result(
        "phone_photos",
        workload=workload_name(args.export, "int8" if args.precision == "int8" else ""),
        folder=args.results_dir,
        figures={
            "model": f"{manifest['arch']} at {crop} px",
            "precision": args.precision,
            "rounds": args.rounds,
            "photo_size": list(PHONE_PHOTO_SIZE),
            "services": median,
            "ratios": {"auto_over_exact_c64": speedup, "in_process_auto_over_exact": ceiling},
            "in_process_by_round": limits,
            "auto_over_exact_c64_by_round": by_round,
            "decode_check": check,
            "seconds": {f"{d}_p50_c1": median[d]["1"]["p50_ms"] / 1000 for d in ("exact", "auto")},
            "goal": GOAL,
            "goal_met": met,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
