"""`python -m export` wall time for resnet18 and resnet50, split into its phases.

    python bench/export_time.py [--device cpu|cuda] [--rounds 3]

Each checkpoint is written the ImageNet example's way (arch inside, DataParallel prefixes) and exported
with no flags. Phases (load, onnx, torchscript, safetensors, parity) come from the manifest's `timings`;
the wall time also counts interpreter start and imports. Ratios: each phase's share of the export.
Each round exports both; figures are medians over rounds.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torchvision

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.results import write_result  # noqa: E402
from contract.manifest import read_manifest_unchecked  # noqa: E402

ARCHS = ("resnet18", "resnet50")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="export-bench-"))
    figures: dict = {"device": args.device, "rounds": args.rounds, "seconds": {}, "ratios": {}, "phases": {}}
    runs: dict[str, list[tuple[float, dict[str, float]]]] = {arch: [] for arch in ARCHS}
    for _ in range(args.rounds):
        for arch in ARCHS:  # interleaved, so drift of the machine hits both alike
            ckpt = work / f"{arch}.pth.tar"
            model = torch.nn.DataParallel(torchvision.models.get_model(arch, weights=None))
            torch.save({"epoch": 90, "arch": arch, "state_dict": model.state_dict()}, ckpt)
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "export", str(ckpt), "--no-bento", "--device", args.device],
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
            wall = time.perf_counter() - started
            runs[arch].append((wall, read_manifest_unchecked(work / f"{arch}.pth.export")["timings"]))
    for arch in ARCHS:
        wall = statistics.median(w for w, _ in runs[arch])
        phases = {phase: statistics.median(t[phase] for _, t in runs[arch]) for phase in runs[arch][0][1]}
        total = sum(phases.values())
        figures["phases"][arch] = phases
        figures["seconds"][f"{arch}_wall"] = wall
        figures["seconds"][f"{arch}_export"] = total
        for phase, seconds in phases.items():
            figures["ratios"][f"{arch}_{phase}_share"] = seconds / total
        print(
            f"{arch}: wall {wall:.1f} s (export {total:.1f} s): "
            + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items())
        )
    write_result("export_time", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
