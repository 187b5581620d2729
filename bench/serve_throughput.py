"""Serving efficiency: our service against the in-process limit and against a plain BentoML service.

    python bench/serve_throughput.py [--device cpu|cuda] [--requests 300] [--rounds 3]

Model: resnet18 at 224 px, 1000 classes, random weights, exported by `python -m export` (or --export DIR).
- limit: the same JPEGs decoded, preprocessed and run through ONNX Runtime in this one process, at the
  best batch size, measured while no server runs (both cores, ONNX Runtime's default threads);
- peer: bench/peer/service.py, a plain BentoML service (decode inside the API, one model call per request);
- ours: `bentoml serve` with serve/service.py.
Both services get the whole machine, as the limit does (ONNX Runtime's thread pool sets its own
affinities, so `taskset` would not confine it: like is compared with like by giving all three everything).
The load client is one asyncio process with httpx on the same machine, sending JPEG uploads at
concurrency 1, 16 and 64. Medians over rounds; ratios are taken within the run.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.results import write_result  # noqa: E402
from export.manifest import read_manifest_unchecked  # noqa: E402
from harness.server import BentoServer  # noqa: E402
from serve.preprocess import Preprocessor  # noqa: E402
from serve.runtime import onnx_providers  # noqa: E402

CONCURRENCY = (1, 16, 64)


EXPECTED_PROVIDER = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def assert_provider(side: str, providers: list[str], device: str) -> None:
    """A silent CPU fallback must not pass for a GPU figure: every side runs where it was asked to."""
    if providers[0] != EXPECTED_PROVIDER[device]:
        raise SystemExit(
            f"{side}: ONNX Runtime runs on {providers[0]}, not {EXPECTED_PROVIDER[device]}; "
            "the comparison would not be like with like"
        )


def make_model(folder: Path, *export_flags: str) -> Path:
    import torch
    import torchvision

    torch.manual_seed(0)
    ckpt = folder / "resnet18.pth"
    torch.save({"arch": "resnet18", "state_dict": torchvision.models.resnet18().state_dict()}, ckpt)
    out = folder / "resnet18.export"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "export",
            str(ckpt),
            "--formats",
            "onnx",
            "--out",
            str(out),
            "--no-bento",
            *export_flags,
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return out


def make_jpegs(count: int = 32) -> list[bytes]:
    """Real photos (scikit-learn's samples), cut into varied 400x300 views, as JPEG bytes."""
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(0)
    photos = [Image.fromarray(img) for img in load_sample_images().images]
    out = []
    for i in range(count):
        photo = photos[i % len(photos)]
        left, top = int(rng.integers(0, photo.width - 400)), int(rng.integers(0, photo.height - 300))
        buffer = io.BytesIO()
        photo.crop((left, top, left + 400, top + 300)).save(buffer, format="JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def write_jpegs(folder: Path, count: int) -> Path:
    """`count` JPEG views (make_jpegs) as files in `folder`: calibration and check images for --int8."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, data in enumerate(make_jpegs(count)):
        (folder / f"{i:03d}.jpg").write_bytes(data)
    return folder


def measure_limit(
    folder: Path, jpegs: list[bytes], device: str, seconds: float = 6.0, model_file: str = "model.onnx"
) -> dict:
    import onnxruntime as ort

    manifest = read_manifest_unchecked(folder)
    pre = Preprocessor.from_manifest(manifest["preprocess"], max_pixels=10**8)
    session = ort.InferenceSession(str(folder / model_file), providers=onnx_providers(device))
    assert_provider("limit", session.get_providers(), device)

    def one_batch(batch: list[bytes]) -> None:
        x = np.stack([pre(pre.decode(data)) for data in batch])
        session.run(None, {"input": x})

    best, per_batch = 0.0, {}
    for size in (1, 4, 8, 16, 32):
        batches = [[jpegs[(i * size + j) % len(jpegs)] for j in range(size)] for i in range(4)]
        one_batch(batches[0])  # warm-up
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds / 5:
            one_batch(batches[done % len(batches)])
            done += 1
        per_batch[size] = done * size / (time.perf_counter() - started)
        best = max(best, per_batch[size])
    single = []
    for i in range(30):
        t0 = time.perf_counter()
        one_batch([jpegs[i % len(jpegs)]])
        single.append(time.perf_counter() - t0)
    return {"images_per_s": best, "by_batch_size": per_batch, "single_image_ms": 1000 * statistics.median(single)}


async def load(url: str, jpegs: list[bytes], concurrency: int, requests: int) -> dict:
    latencies: list[float] = []
    errors = 0
    counter = iter(range(requests))

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal errors
        for i in counter:
            t0 = time.perf_counter()
            response = await client.post(
                f"{url}/classify", files={"image": ("photo.jpg", jpegs[i % len(jpegs)], "image/jpeg")}
            )
            latencies.append(time.perf_counter() - t0)
            errors += response.status_code != 200

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await client.post(f"{url}/classify", files={"image": ("photo.jpg", jpegs[0], "image/jpeg")})  # warm
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {
        "images_per_s": requests / elapsed,
        "p50_ms": 1000 * float(np.percentile(latencies, 50)),
        "p99_ms": 1000 * float(np.percentile(latencies, 99)),
        "errors": errors,
    }


def run_service(server: BentoServer, jpegs: list[bytes], requests: int, rounds: int) -> dict:
    results: dict = {"ready_s": server.wait_ready()}  # launch to /readyz 200, warm-up included
    for c in CONCURRENCY:
        n = requests if c > 1 else max(50, requests // 4)
        runs = [asyncio.run(load(server.url, jpegs, c, n)) for _ in range(rounds)]
        results[c] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--requests", type=int, default=300, help="requests per concurrency level and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--export", type=Path, help="serve this export folder instead of a fresh resnet18 (default)")
    p.add_argument("--results-dir", type=Path, default=None, help="where the JSON goes (default: bench/results)")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    folder = args.export or make_model(work)
    jpegs = make_jpegs()
    limit = measure_limit(folder, jpegs, args.device)
    print(
        f"limit (in-process, best batch): {limit['images_per_s']:.1f} images/s; single image "
        f"{limit['single_image_ms']:.1f} ms; by batch size "
        f"{ {k: round(v, 1) for k, v in limit['by_batch_size'].items()} }"
    )
    services = {}
    with BentoServer(
        work / "peer.log",
        target="service:PeerClassifier",
        cwd=ROOT / "bench" / "peer",
        PEER_MODEL_DIR=str(folder),
        PEER_DEVICE=args.device,
    ) as peer:
        services["peer"] = run_service(peer, jpegs, args.requests, args.rounds)
        assert_provider(
            "peer", [httpx.post(f"{peer.url}/provider", json={}, timeout=10).json()["provider"]], args.device
        )
    with BentoServer(work / "ours.log", HANDOFF_MODEL_DIR=str(folder), HANDOFF_DEVICE=args.device) as ours:
        services["ours"] = run_service(ours, jpegs, args.requests, args.rounds)
        assert_provider("ours", [httpx.get(f"{ours.url}/info", timeout=10).json()["provider"]], args.device)

    ratios = {}
    print(
        f"launch to /readyz 200: peer {services['peer']['ready_s']:.1f} s, ours {services['ours']['ready_s']:.1f} s "
        f"(ours warms up every batch size first)"
    )
    for c in CONCURRENCY:
        for name in ("peer", "ours"):
            r = services[name][c]
            print(
                f"{name:<5} c={c:<3} {r['images_per_s']:6.1f} images/s  p50 {r['p50_ms']:7.1f} ms  "
                f"p99 {r['p99_ms']:7.1f} ms  errors {r['errors']:.0f}"
            )
        ratios[f"ours_over_limit_c{c}"] = services["ours"][c]["images_per_s"] / limit["images_per_s"]
        ratios[f"peer_over_limit_c{c}"] = services["peer"][c]["images_per_s"] / limit["images_per_s"]
        ratios[f"ours_over_peer_c{c}"] = services["ours"][c]["images_per_s"] / services["peer"][c]["images_per_s"]
    added_ms = services["ours"][1]["p50_ms"] - limit["single_image_ms"]
    for key, value in ratios.items():
        print(f"  {key:<22} {value:5.2f} x")
    print(f"  ours p50 at c=1 minus in-process single image: {added_ms:+.1f} ms")
    goal = (
        (ratios["ours_over_limit_c64"] >= 0.9 and added_ms <= 3)
        if args.device == "cpu"
        else ratios["ours_over_peer_c64"] >= 2
    )
    print(
        f"goal ({'>= 0.9 x limit at c=64 and p50 within 3 ms' if args.device == 'cpu' else '>= 2 x peer'}): "
        f"{'met' if goal else 'NOT met'}"
    )
    write_result(
        f"serve_throughput_{args.device}",
        folder=args.results_dir,
        figures={
            "device": args.device,
            "limit": limit,
            "services": {n: {str(c): r for c, r in s.items()} for n, s in services.items()},
            "ratios": ratios,
            "added_ms_at_c1": added_ms,
            "median_seconds": {
                "limit_single_image": limit["single_image_ms"] / 1000,
                "ours_p50_c1": services["ours"][1]["p50_ms"] / 1000,
                "ours_p50_c64": services["ours"][64]["p50_ms"] / 1000,
                "ours_p99_c64": services["ours"][64]["p99_ms"] / 1000,
                "ours_launch_to_ready": services["ours"]["ready_s"],
                "peer_launch_to_ready": services["peer"]["ready_s"],
            },
            "goal": "CPU: ours >= 0.9 x limit at c=64 and p50(c=1) within 3 ms of in-process; GPU: >= 2 x peer",
            "goal_met": goal,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
