"""One entry point for the lasting benchmarks (bench/catalog.py).

    python -m bench                      # list them, with where each has a current result
    python -m bench NAME [OPTIONS]       # run one; `python -m bench NAME --help` for its options
    python -m bench all                  # every one with `make bench`'s settings (about 90 minutes on 2 cores)
    python -m bench report               # the current results as Markdown (the docs site shows the same page)

Each prints its figures side by side (ratios against the in-process limit or a peer measured in the same run)
and writes bench/results/MACHINE/NAME.json, replacing that machine's last result; `--results-dir DIR` writes
elsewhere. The serving benchmarks load the service with wrk where it is installed (`apt-get install wrk`),
else httpx.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import results  # noqa: E402
from bench.catalog import BENCHMARKS, BY_NAME  # noqa: E402
from bench.report import render, results_of  # noqa: E402


def run(name: str, argv: list[str]) -> int:
    results.COMMAND[:] = ["-m", "bench", name, *argv]
    module = importlib.import_module(f"bench.{name}")
    return int(module.main(argv) or 0)


def listing() -> str:
    lines = [__doc__.strip().split("\n\n")[1], "", "benchmarks:"]
    for benchmark in BENCHMARKS:
        machines = sorted({machine for machine, _ in results_of(benchmark)})
        lines.append(f"  {benchmark.name:<18} {benchmark.answers}")
        lines.append(f"  {'':<18} results: {', '.join(machines) or 'none yet'}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(listing())
        return 0
    name, rest = argv[0], argv[1:]
    if name == "report":
        print(render())
        return 0
    if name == "all":
        failed = [b.name for b in BENCHMARKS if run(b.name, [*b.make_bench, *rest]) != 0]
        if failed:
            print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1 if failed else 0
    if name not in BY_NAME:
        print(f"python -m bench: no benchmark {name!r}; one of: {', '.join(BY_NAME)}, all, report", file=sys.stderr)
        return 2
    return run(name, rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
