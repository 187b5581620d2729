"""The current results as one Markdown page: for each benchmark, each machine's latest figures beside its goal.

The docs site builds it (docs/hooks.py), so the page is never committed and never stale; `python -m bench report`
prints it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.catalog import BENCHMARKS, Benchmark
from bench.results import RESULTS

GOAL_STATE = {True: "met", False: "**not met**", None: "n/a"}


def results_of(benchmark: Benchmark, folder: Path = RESULTS) -> list[tuple[str, dict[str, Any]]]:
    """(machine folder, result) for every stored result of `benchmark`, its default workload first."""
    found = []
    for path in sorted(folder.glob(f"*/{benchmark.name}*.json")):
        result = json.loads(path.read_text())
        if result.get("benchmark") == benchmark.name:
            found.append((path.parent.name, result))
    return sorted(found, key=lambda item: (item[1].get("workload", "default") != "default", item[0]))


def headline(benchmark: Benchmark, result: dict[str, Any]) -> str:
    """The ratios a reader looks at first, else the result's first figures."""
    ratios = result.get("ratios", {})
    shown = [f"{key} **{ratios[key]:.2f} x**" for key in benchmark.headline if key in ratios]
    if not shown:
        shown = [f"{key}: {value}" for key, value in list(result.get("figures", {}).items())[:3]]
    return "<br>".join(shown)


def render(folder: Path = RESULTS) -> str:
    lines = [
        "# Benchmark results",
        "",
        "Generated from `bench/results/MACHINE/*.json` when the site is built: each benchmark's current result on",
        "each machine it ran on. Every ratio was taken side by side in one run; `rounds` says whether a figure is a",
        "median of rounds. How to run them and what each compares: [Benchmarks](../benchmarks.md).",
        "",
    ]
    for benchmark in BENCHMARKS:
        lines += [f"## {benchmark.name}", "", benchmark.answers + ".", ""]
        results = results_of(benchmark, folder)
        if not results:
            lines += ["No result stored yet.", ""]
            continue
        lines += ["| machine | workload | when | rounds | headline | goal |", "| --- | --- | --- | --- | --- | --- |"]
        for machine, result in results:
            goal = f"{result['goal']}: {GOAL_STATE[result.get('goal_met')]}" if result.get("goal") else "n/a"
            workload, when, rounds = result.get("workload", "default"), result["when"][:10], result.get("rounds", 1)
            lines.append(f"| {machine} | {workload} | {when} | {rounds} | {headline(benchmark, result)} | {goal} |")
        lines += ["", "Commands:", ""]
        lines += [f"- {machine}: `{result['command']}`" for machine, result in results]
        lines.append("")
    return "\n".join(lines)
