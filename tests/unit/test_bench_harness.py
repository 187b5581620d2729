"""The benchmark harness (bench/__main__.py, catalog.py, results.py, report.py): one entry point that knows every
lasting benchmark, one current result file per benchmark and machine, and a results page that shows them."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # bench/ is scripts, not an installed package
from bench import results  # noqa: E402
from bench.catalog import BENCHMARKS  # noqa: E402
from bench.report import render, results_of  # noqa: E402


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_the_listing_names_every_benchmark_and_an_unknown_name_is_one_line_and_exit_2():
    listing = bench()
    assert listing.returncode == 0
    assert [b.name for b in BENCHMARKS] == re.findall(r"^  (\w+) ", listing.stdout, flags=re.M)
    unknown = bench("serve_throughtput")
    assert unknown.returncode == 2 and len(unknown.stderr.splitlines()) == 1
    assert "no benchmark 'serve_throughtput'" in unknown.stderr and "serve_throughput" in unknown.stderr


@pytest.mark.parametrize("benchmark", BENCHMARKS, ids=lambda b: b.name)
def test_each_benchmark_takes_its_arguments_as_make_bench_gives_them(benchmark, capsys):
    """Each module's main(argv) parses `make bench`'s arguments (a renamed option would fail `make bench` an
    hour in); --help shows them without running anything."""
    module = importlib.import_module(f"bench.{benchmark.name}")
    with pytest.raises(SystemExit) as shown:
        module.main(["--help"])
    assert shown.value.code == 0
    options = set(re.findall(r"--[\w-]+", capsys.readouterr().out))
    assert {arg for arg in benchmark.make_bench if arg.startswith("--")} <= options


def test_a_result_goes_to_its_machine_and_workload_and_records_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    monkeypatch.setattr(results, "COMMAND", ["-m", "bench", "workers", "--rounds", "1"])
    machine = results.machine_name("cpu")
    assert re.fullmatch(r"[a-z0-9-]+-\d+-cores", machine), machine
    default = results.write_result("workers", {"device": "cpu", "ratios": {"x": 1.0}})
    other = results.write_result("workers", {"device": "cpu"}, workload="resnet18-32px")
    assert default == tmp_path / machine / "workers.json"
    assert other == tmp_path / machine / "workers-resnet18-32px.json"
    record = json.loads(default.read_text())
    assert record["benchmark"] == "workers" and record["workload"] == "default"
    assert record["command"] == "python -m bench workers --rounds 1" and record["machine"]["cpus"] >= 1
    again = results.write_result("workers", {"device": "cpu", "ratios": {"x": 2.0}})
    assert again == default and json.loads(again.read_text())["ratios"] == {"x": 2.0}, "one current result"


def test_every_stored_result_is_a_lasting_benchmarks_and_its_headline_exists():
    """A result file per lasting benchmark and machine, nothing else in bench/results; the ratios the results
    page shows first are in the stored results (a renamed ratio would leave the page blank)."""
    stored = sorted(results.RESULTS.glob("*/*.json"))
    names = {b.name for b in BENCHMARKS}
    assert stored and all(json.loads(p.read_text())["benchmark"] in names for p in stored)
    assert not list(results.RESULTS.glob("*.json")), "results live in a folder per machine"
    for benchmark in BENCHMARKS:
        found = results_of(benchmark)
        assert found, f"{benchmark.name}: no stored result"
        keys = set().union(*(result.get("ratios", {}) for _, result in found))
        missing = [key for key in benchmark.headline if key not in keys]
        assert not missing or benchmark.name == "workers", (benchmark.name, missing)


def test_the_results_page_shows_each_benchmark_and_its_goal():
    page = render()
    for benchmark in BENCHMARKS:
        assert f"## {benchmark.name}\n" in page
    assert "**not met**" in page and "| met" not in page.replace("**not met**", "")


def test_a_serving_result_keeps_every_round_and_the_medians(tmp_path):
    from argparse import Namespace

    from bench.serving import over_limit, write_serving_result

    rounds = [
        {"limit": {"images_per_s": rate}, "ours": {"64": {"images_per_s": rate * share}}}
        for rate, share in ((100.0, 0.9), (80.0, 0.95), (90.0, 0.5))
    ]
    median = results.median_of_rounds(rounds)
    args = Namespace(export=None, results_dir=tmp_path, device="cpu")
    ratios = over_limit(median, ["ours"], [64])
    path = write_serving_result("detection_serving", args, rounds, median, ["ours"], {"ratios": ratios})
    record = json.loads(path.read_text())
    assert path == tmp_path / "detection_serving.json" and record["rounds"] == 3 and record["per_round"] == rounds
    assert record["limit"] == {"images_per_s": 90.0} and record["services"]["ours"]["64"]["images_per_s"] == 76.0
    assert record["ratios"] == {"ours_over_limit_c64": 76.0 / 90.0}, "the ratio of the medians, not a round's"


def test_the_serving_lines_show_each_sides_cpu_by_thread_alone_and_at_c64(capsys):
    """Where a server's CPU goes is printed for a lone request (c=1) and at c=64, each side's threads by name."""
    from bench.serving import print_sides

    def level(loop_ms: float) -> dict:
        by_thread = {"worker: main thread": loop_ms, "worker: other threads": 0.8}
        figures = dict(images_per_s=100.0, p50_ms=1.0, p99_ms=2.0, server_cpu_ms_per_image=1.0, errors=0)
        return {**figures, "server_cpu_ms_per_image_by_thread": by_thread}

    print_sides({"ours": {"1": level(0.48), "16": level(0.3), "64": level(0.227)}}, ["ours"], [1, 16, 64])
    lines = [line for line in capsys.readouterr().out.splitlines() if "by thread" in line]
    assert [line.split(",")[0].strip() for line in lines] == ["ours c=1", "ours c=64"]
    assert "worker: main thread 480" in lines[0] and "worker: main thread 227" in lines[1]
