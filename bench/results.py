"""Benchmark results: one JSON per benchmark and machine, bench/results/MACHINE/BENCHMARK.json, and what every
benchmark prints beside them (its ratios, its goal)."""

from __future__ import annotations

import json
import os
import platform
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def cpu_model() -> str:
    """The CPU's name and its widest vector instructions, which decide INT8's and the model's speed: the same
    2-core machine has been an Intel CPU with AVX-512 VNNI and an AMD EPYC with AVX2 only, twice as slow."""
    name, flags = platform.processor() or "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    for flag, label in (("avx512_vnni", "AVX-512 VNNI"), ("avx512f", "AVX-512"), ("avx2", "AVX2")):
        if flag in flags:
            return f"{name}, {label}"
    return name


def machine() -> dict[str, Any]:
    import torch

    return {
        "cpus": os.cpu_count(),
        "cpu": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def median_of_rounds(rounds: list[Any]) -> Any:
    """The per-round figures (nested dicts alike in shape) with every number replaced by its median over rounds;
    other values are kept when all rounds agree, else listed."""
    first = rounds[0]
    if isinstance(first, dict):
        return {key: median_of_rounds([r[key] for r in rounds]) for key in first}
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        return statistics.median(rounds)
    return first if all(r == first for r in rounds) else list(rounds)


def side_order(sides: list[str], round_: int) -> list[str]:
    """The order in which round `round_` measures `sides`: rotated by one each round and reversed in every other
    pair of rounds, so that no side always follows the same one (in a plain rotation, the side measured right
    after LitServe read low in every round, on the digits model) and each of two sides goes first in half the
    rounds (reversing every other round undid the rotation of two sides: an A/B measured A first every time)."""
    shift = round_ % len(sides)
    rotated = sides[shift:] + sides[:shift]
    return rotated[::-1] if (round_ // 2) % 2 else rotated


def median_with_interval(values: list[float], level: float = 0.9, resamples: int = 2000) -> tuple[float, float, float]:
    """The median of `values` and a bootstrap interval around it (percentiles of the medians of `resamples`
    resamples drawn with replacement; a fixed seed, so a result file is reproducible from its rounds)."""
    draw = random.Random(0)
    medians = sorted(statistics.median(draw.choices(values, k=len(values))) for _ in range(resamples))
    tail = (1 - level) / 2
    return statistics.median(values), medians[int(tail * resamples)], medians[int((1 - tail) * resamples) - 1]


def machine_name(device: str = "cpu") -> str:
    """The folder a machine's results live in: the GPU's name for a CUDA figure, else the CPU's name, widest vector
    instructions and core count (`intel-xeon-avx-512-vnni-2-cores`); figures from two machines never overwrite each
    other."""
    if device == "cuda":
        import torch

        label = torch.cuda.get_device_name() if torch.cuda.is_available() else "cuda-unknown"
    else:
        label = f"{cpu_model()} {os.cpu_count()} cores"
    words = re.sub(r"\((r|tm)\)|processor", " ", label.lower())
    return "-".join(re.findall(r"[a-z0-9]+", words))


def result_path(benchmark: str, device: str = "cpu", workload: str = "", folder: Path | None = None) -> Path:
    """bench/results/MACHINE/BENCHMARK.json, or BENCHMARK-WORKLOAD.json for a workload other than the default."""
    name = f"{benchmark}-{workload}" if workload else benchmark
    return (folder or RESULTS / machine_name(device)) / f"{name}.json"


def write_result(benchmark: str, figures: dict[str, Any], workload: str = "", folder: Path | None = None) -> Path:
    """The current result of `benchmark` on this machine (one file each, replaced by the next run), or in `folder`
    (the GPU check's output, a scratch run's)."""
    path = result_path(benchmark, figures.get("device", "cpu"), workload, folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": benchmark,
        "workload": workload or "default",
        "command": " ".join(["python", *COMMAND]) if COMMAND else " ".join([Path(sys.executable).name, *sys.argv]),
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine(),
        **figures,
    }
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path.relative_to(RESULTS.parent.parent) if path.is_relative_to(RESULTS) else path}")
    return path


COMMAND: list[str] = []  # the command line as `python -m bench` was given it, recorded in each result


def print_ratios(ratios: dict[str, float]) -> None:
    """Every ratio of a run, one a line, aligned: what a reader compares first."""
    width = max(map(len, ratios), default=0)
    for key, value in ratios.items():
        print(f"  {key:<{width}} {value:5.2f} x")


def print_goal(goal: str, met: bool | None) -> None:
    print(f"goal: {goal}: {'n/a' if met is None else 'met' if met else 'NOT met'}")
