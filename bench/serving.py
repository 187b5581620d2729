"""What every serving benchmark shares: rounds of an in-process limit beside served sides, and how their figures
are printed and compared (bench/serve_throughput.py, text_serving.py, detection_serving.py, workers.py).

A round measures the limit, then each side in turn (bench/results.side_order), one server at a time; figures are
medians of rounds, and each side at c=64 is also divided by its own round's limit (paired, so drift of the
machine between rounds cancels and the spread shows whether a median above a goal is one lucky round).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.results import side_order, write_result
from bench.workload import workload_name

BASELINE = "at_"  # a side serving another checkout of handoff (serve_throughput --baseline)


def is_ours(side: str) -> bool:
    """A side served by handoff's own service (`ours...`, or another checkout's, `at_...`), not by a peer."""
    return side.startswith(("ours", BASELINE))


SERVERS_INSTEAD = ("peer_triton", "peer_triton_image", "peer_kserve", "peer_ray", "peer_mlserver")
"""the servers a user would pick instead of handoff (bench/peer/): their models build their sessions on the CPU"""


def served_provider(side: str, url: str) -> str:
    """The ONNX Runtime provider a served side runs on: ours says it on /info, the servers instead build theirs on
    the CPU, the other peers say it on POST /provider."""
    if is_ours(side):
        return httpx.get(f"{url}/info", timeout=10).json()["provider"]
    if side in SERVERS_INSTEAD:
        return "CPUExecutionProvider"
    return httpx.post(f"{url}/provider", json={}, timeout=10).json()["provider"]


def measure_rounds(
    rounds: int,
    sides: Sequence[str],
    limit: Callable[[], dict[str, Any]],
    side: Callable[[str, int, dict[str, Any]], dict[str, Any]],
    unit: str = "images",
    shown: str = "64",
) -> list[dict[str, Any]]:
    """`rounds` rounds of {"limit": limit(), name: side(name, round, this_round) for each side}, each printed as it
    ends with every side's rate at concurrency `shown`."""
    measured: list[dict[str, Any]] = []
    for round_ in range(rounds):
        this_round: dict[str, Any] = {"limit": limit()}
        for name in side_order(list(sides), round_):
            this_round[name] = side(name, round_, this_round)
        measured.append(this_round)
        print(
            f"round {round_ + 1}/{rounds}: limit {this_round['limit']['images_per_s']:.1f} {unit}/s, "
            + ", ".join(f"{n} c={shown} {this_round[n][shown]['images_per_s']:.1f}" for n in sides)
        )
    return measured


def print_sides(median: dict[str, Any], sides: Sequence[str], concurrency: Sequence[int], unit: str = "images") -> None:
    """One line per side and concurrency: rate, latency, the server's CPU per item, errors; then, at c=1 (a lone
    request's, whose event loop runs cold between the model's calls) and at c=64, where each side's server CPU
    went."""
    width = max(map(len, sides), default=0)
    for c in map(str, concurrency):
        for name in sides:
            r = median[name][c]
            print(
                f"{name:<{width}} c={c:<3} {r['images_per_s']:7.1f} {unit}/s  p50 {r['p50_ms']:7.1f} ms  "
                f"p99 {r['p99_ms']:7.1f} ms  server CPU {r['server_cpu_ms_per_image']:5.1f} ms/{unit[:-1]}  "
                f"errors {r['errors']:.0f}"
            )
    for shown in (1, 64):
        if shown in concurrency:
            print_cpu_by_thread(median, sides, unit, str(shown))


def print_cpu_by_thread(median: dict[str, Any], sides: Sequence[str], unit: str = "images", shown: str = "64") -> None:
    """Where each side's server CPU goes at concurrency `shown`: by process, the main thread (a Python server's event
    loop) apart from the others, in microseconds an item."""
    for name in sides:
        parts = median[name][shown].get("server_cpu_ms_per_image_by_thread", {})
        spent = ", ".join(f"{key} {1000 * ms:.0f}" for key, ms in sorted(parts.items(), key=lambda p: -p[1]) if ms)
        print(f"  {name} c={shown}, server CPU by thread (us/{unit[:-1]}): {spent}")


def over_limit(median: dict[str, Any], sides: Sequence[str], concurrency: Sequence[int]) -> dict[str, float]:
    """Each side's rate over the limit's (medians of rounds), as `NAME_over_limit_cC`."""
    rate = median["limit"]["images_per_s"]
    return {f"{n}_over_limit_c{c}": median[n][str(c)]["images_per_s"] / rate for c in concurrency for n in sides}


def over_peers(
    median: dict[str, Any], ours: Sequence[str], peers: Sequence[str], concurrency: Sequence[int]
) -> dict[str, float]:
    """Each of our sides over each peer, at each concurrency, as `OURS_over_PEER_cC`."""
    return {
        f"{o}_over_{p}_c{c}": median[o][str(c)]["images_per_s"] / median[p][str(c)]["images_per_s"]
        for c in concurrency
        for o in ours
        for p in peers
    }


def paired_over_limit(rounds: list[dict[str, Any]], sides: Sequence[str], at: str = "64") -> dict[str, str]:
    """Each side at c=`at` over the same round's limit, round by round, printed and returned as figures."""
    figures = {}
    for name in sides:
        values = [r[name][at]["images_per_s"] / r["limit"]["images_per_s"] for r in rounds]
        figures[f"{name} c={at} / the same round's limit, round by round"] = " ".join(f"{v:.2f}" for v in values)
        print(f"  {name} c={at} / the same round's limit, round by round: {' '.join(f'{v:.2f}' for v in values)}")
    return figures


def write_serving_result(
    benchmark: str,
    args: Any,
    rounds: list[dict[str, Any]],
    median: dict[str, Any],
    sides: Sequence[str],
    report: dict[str, Any],
    *variants: str,
) -> Path:
    """A serving benchmark's result: the limit, each side's medians, every round, and `report` (its `ratios`,
    `seconds`, `figures`, `goal` and `goal_met`); named for the export when --export chose the workload, and for
    `variants` other than the benchmark's default."""
    return write_result(
        benchmark,
        workload=workload_name(args.export, *variants),
        folder=args.results_dir,
        figures={
            "device": args.device,
            "rounds": len(rounds),
            "limit": median["limit"],
            "services": {name: median[name] for name in sides},
            "per_round": rounds,
            **report,
        },
    )
