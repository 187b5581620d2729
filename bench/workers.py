"""Workers per device: the service with 1, 2, 4... HTTP workers on one device, against the in-process limit and
the floor peer, at high concurrency.

    python bench/workers.py [--device cpu|cuda] [--workers 1 2 4] [--concurrency 64 256] [--export DIR]
                            [--arrangements]

One event loop cannot feed a fast GPU: at ~1-3 ms of stack CPU per request, one worker answers a few hundred
requests a second whatever the model does. `HANDOFF_WORKERS=N` starts N BentoML workers, each with its own
ONNX Runtime session on the device (as Triton's instance groups do); this measures what N buys. On the CPU
the workers share the cores (each worker's model runs on cores / N threads), so it measures what the extra
event loop costs there; on a GPU it is the figure that picks the default (scripts/gpu_check.sh runs it).

--arrangements answers which way N event loops should feed one device, on the floor peer (no BentoML, so
that only the arrangement differs): `floor_N_sessions`, N workers each with its own session, against
`floor_N_shared_model`, N workers that decode and send their rows to one model process holding the session
(bench/peer/model_process.py). Server CPU counts every process of a side.

Model: resnet18 at 224 px (random weights) unless --export. Load: raw JPEG bodies to /classify (the floor
peer takes the same), by bench/load.py (wrk when installed, else httpx). Each round measures the limit, then
every side in a rotating order; figures are medians over rounds, each side also divided by its own round's
limit (paired).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.limit import InProcessModel, limit_round  # noqa: E402
from bench.load import load_levels, uploads, wrk_available  # noqa: E402
from bench.peer.floor import floor_server  # noqa: E402
from bench.results import median_of_rounds, print_ratios, write_result  # noqa: E402
from bench.serving import measure_rounds, over_limit  # noqa: E402
from bench.workload import make_jpegs, make_model, workload_name  # noqa: E402
from harness.server import BentoServer  # noqa: E402


def start(side: str, folder: Path, args: Any, log: Path) -> BentoServer:
    if side == "peer_floor":
        return floor_server(log, folder, args.device)
    if side.startswith("floor_"):  # floor_N_sessions or floor_N_shared_model
        count = int(side.split("_")[1])
        return floor_server(log, folder, args.device, count, shared_model=side.endswith("shared_model"))
    workers = side.removeprefix("ours_").removesuffix("_workers")
    return BentoServer(
        log,
        HANDOFF_MODEL_DIR=str(folder),
        HANDOFF_DEVICE=args.device,
        HANDOFF_WORKERS=workers,
        HANDOFF_PRECISION=args.precision,
    )


def measure(side: str, folder: Path, jpegs: list[bytes], args: Any, log: Path) -> dict[str, Any]:
    with start(side, folder, args, log) as server:
        server.wait_ready()
        levels = tuple(args.concurrency)
        return load_levels(args.client, server.url, server.proc.pid, uploads(jpegs, "raw"), levels, args.seconds)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts to compare")
    p.add_argument("--concurrency", type=int, nargs="+", default=[64, 256], help="client concurrency levels")
    p.add_argument("--seconds", type=float, default=6.0, help="load per level, side and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--client", choices=("wrk", "httpx"), default="wrk" if wrk_available() else "httpx")
    p.add_argument("--export", type=Path, help="serve this export folder instead of a fresh resnet18 (default)")
    p.add_argument(
        "--precision",
        choices=("fp32", "int8"),
        default="fp32",
        help="int8: serve and time the export's model.int8.onnx (an --export made with --int8); no floor peer then",
    )
    p.add_argument(
        "--arrangements",
        action="store_true",
        help="also the floor with each worker count above 1, each worker its own session or one model process",
    )
    p.add_argument("--results-dir", type=Path, default=None, help="where the JSON goes (default: bench/results)")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="workers-bench-"))
    folder = args.export.resolve() if args.export else make_model(work)
    jpegs = make_jpegs()
    model = InProcessModel(folder, args.device, "model.int8.onnx" if args.precision == "int8" else "model.onnx")
    floor = ["peer_floor"] if args.precision == "fp32" else []  # the floor serves model.onnx only
    sides = [f"ours_{n}_workers" for n in args.workers] + floor
    if args.arrangements:
        sides += [f"floor_{n}_{way}" for n in args.workers if n > 1 for way in ("sessions", "shared_model")]
    rounds = measure_rounds(
        args.rounds,
        sides,
        lambda: limit_round(model, jpegs, args.seconds),
        lambda side, round_, _: measure(side, folder, jpegs, args, work / f"{side}{round_}.log"),
        shown=str(max(args.concurrency)),
    )
    median = median_of_rounds(rounds)
    print(f"limit (in-process, median of {args.rounds} rounds): {median['limit']['images_per_s']:.1f} images/s")
    figures: dict[str, str] = {}
    for c in map(str, args.concurrency):
        for side in sides:
            r = median[side][c]
            paired = statistics.median(x[side][c]["images_per_s"] / x["limit"]["images_per_s"] for x in rounds)
            line = (
                f"{r['images_per_s']:7.1f} images/s ({paired:.2f} x the limit, paired)  p50 {r['p50_ms']:6.1f} ms  "
                f"p99 {r['p99_ms']:6.1f} ms  server CPU {r['server_cpu_ms_per_image']:4.1f} ms/image  "
                f"errors {r['errors']:.0f}"
            )
            print(f"{side:<22} c={c:<4} {line}")
            figures[f"{side} c={c}"] = line
    ratios = over_limit(median, sides, args.concurrency)
    print_ratios(ratios)
    write_result(
        "workers",
        {
            "device": args.device,
            "precision": args.precision,
            "client": args.client,
            "rounds": args.rounds,
            "figures": figures,
            "ratios": ratios,
            "limit": median["limit"],
            "sides": {side: median[side] for side in sides},
        },
        workload=workload_name(
            args.export, "int8" if args.precision == "int8" else "", "arrangements" if args.arrangements else ""
        ),
        folder=args.results_dir,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
