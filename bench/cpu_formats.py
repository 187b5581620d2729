"""Which artifact to run on the CPU: ONNX Runtime (fp32 and INT8) against AOTInductor and torch.export's
ExportedProgram, model alone (no decoding, no HTTP).

    python bench/cpu_formats.py [--rounds 5]

resnet18 at 224 px, random weights, exported once with --formats onnx,pt2,aoti --int8. Each round runs
every runtime at batch 1 and 8 for a fixed count of batches, runtimes interleaved within the round;
figures are medians of rounds. ONNX Runtime with the service's session settings.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.results import write_result  # noqa: E402
from bench.workload import make_model, write_jpegs  # noqa: E402
from serve.runtime import onnx_session_options  # noqa: E402

BATCHES = (1, 8)


def runners(folder: Path) -> dict:
    import onnxruntime as ort
    import torch

    def onnx(name: str):
        session = ort.InferenceSession(str(folder / name), onnx_session_options(), providers=["CPUExecutionProvider"])
        return lambda x: session.run(None, {"input": x})[0]

    aoti = torch._inductor.aoti_load_package(str(folder / "model.aoti.pt2"))
    program = torch.export.load(str(folder / "model.pt2")).module()

    def torch_runner(module):
        def run(x: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                return module(torch.from_numpy(x)).numpy()

        return run

    return {
        "onnxruntime_fp32": onnx("model.onnx"),
        "onnxruntime_int8": onnx("model.int8.onnx"),
        "aotinductor": torch_runner(aoti),
        "torch_export_eager": torch_runner(program),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--images", type=int, default=48, help="images per runtime, batch size and round")
    p.add_argument("--results-dir", type=Path, default=None)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="formats-bench-"))
    samples = write_jpegs(work / "samples", 64)
    started = time.perf_counter()
    folder = make_model(
        work, "--formats", "onnx,pt2,aoti", "--int8", "--samples", str(samples), "--max-accuracy-drop", "100"
    )
    print(f"export with AOTI compile and INT8: {time.perf_counter() - started:.0f} s")
    run = runners(folder)
    x = {b: np.random.default_rng(0).standard_normal((b, 3, 224, 224)).astype(np.float32) for b in BATCHES}
    for fn in run.values():  # warm-up
        for b in BATCHES:
            fn(x[b])
    rates: dict[str, dict[int, list[float]]] = {name: {b: [] for b in BATCHES} for name in run}
    for _ in range(args.rounds):
        for b in BATCHES:
            for name, fn in run.items():
                count = max(1, args.images // b)
                t0 = time.perf_counter()
                for _ in range(count):
                    fn(x[b])
                rates[name][b].append(count * b / (time.perf_counter() - t0))
    medians = {name: {b: statistics.median(r) for b, r in by_b.items()} for name, by_b in rates.items()}
    for name, by_b in medians.items():
        print(f"{name:<20} " + "  ".join(f"batch {b}: {v:6.1f} images/s" for b, v in by_b.items()))
    ratios = {
        f"{name}_over_onnxruntime_fp32_batch{b}": medians[name][b] / medians["onnxruntime_fp32"][b]
        for name in run
        if name != "onnxruntime_fp32"
        for b in BATCHES
    }
    for key, value in ratios.items():
        print(f"  {key:<44} {value:5.2f} x")
    write_result(
        "cpu_formats_cpu",
        folder=args.results_dir,
        figures={
            "device": "cpu",
            "rounds": args.rounds,
            "images_per_s_median": {n: {str(b): v for b, v in d.items()} for n, d in medians.items()},
            "ratios": ratios,
            "seconds": {f"{n}_batch{b}_per_image": 1 / v for n, d in medians.items() for b, v in d.items()},
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
