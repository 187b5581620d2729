"""Where a served image's CPU goes, thread by thread: our server under load against the limit in process.

    python bench/server_threads.py [--seconds 10] [--concurrency 64] [--export DIR] [--phone-photos]

Each thread's CPU time is read (psutil, from /proc/PID/task on Linux) before and after:
- the server: the BentoML worker process of `bentoml serve` (serve/service.py), under wrk (else httpx) load of
  raw JPEG bodies at --concurrency; its main thread is the event loop (HTTP, BentoML's middlewares, our
  handler); the others decode images and run the model (ONNX Runtime's threads have no Python name);
- the limit: bench/limit.py's overlapped arrangement at batch 32 over the same JPEGs, in this process.
The JPEGs are 400x300 views of real photos, or with --phone-photos 12-megapixel ones (bench/workload.phone_photos)
(served with the fast decode where the export's check passed, as by default).
Reported in ms of CPU per image, thread by thread, busiest first. One run, not a median: a breakdown to read
beside bench/serve_throughput.py's ratios, not a ratio of its own.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.limit import InProcessModel  # noqa: E402
from bench.load import load, uploads, wrk_available  # noqa: E402
from bench.results import write_result  # noqa: E402
from bench.workload import make_jpegs, make_model, phone_photos  # noqa: E402
from harness.server import BentoServer  # noqa: E402


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of `pid`, by thread id."""
    return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}


def per_image_ms(before: dict[int, float], after: dict[int, float], images: float, names: dict[int, str]) -> dict:
    """{"1. thread name": ms of CPU per image}, busiest first (a thread without a Python name is "thread");
    threads that did (almost) nothing are left out."""
    spent = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    rows = sorted(((t, s) for t, s in spent.items() if s >= 0.02), key=lambda row: -row[1])
    return {f"{rank}. {names.get(tid, 'thread')}": round(1000 * s / images, 2) for rank, (tid, s) in enumerate(rows, 1)}


def server_side(folder: Path, jpegs: list[bytes], client: str, concurrency: int, seconds: float, log: Path) -> dict:
    with BentoServer(log, HANDOFF_MODEL_DIR=str(folder)) as server:
        server.wait_ready()
        requests = uploads(jpegs, "raw")
        load(client, server.url, server.proc.pid, requests, concurrency, 2)  # warm-up
        workers = [
            p for p in psutil.Process(server.proc.pid).children(recursive=True) if "worker" in " ".join(p.cmdline())
        ]
        worker = max(workers, key=lambda p: p.memory_info().rss).pid  # the one that loaded the model
        before = thread_cpu(worker)
        result = load(client, server.url, server.proc.pid, requests, concurrency, seconds)
        after = thread_cpu(worker)
    return {
        "images_per_s": result["images_per_s"],
        "threads": per_image_ms(before, after, result["answered"], {worker: "event loop"}),
    }


def limit_side(folder: Path, jpegs: list[bytes], batches: int = 10) -> dict:
    model = InProcessModel(folder, "cpu")
    work = [[jpegs[(i * 32 + j) % len(jpegs)] for j in range(32)] for i in range(batches)]
    model.overlapped(work[:1])  # warm
    before, started = thread_cpu(os.getpid()), time.perf_counter()
    model.overlapped(work)
    wall, after = time.perf_counter() - started, thread_cpu(os.getpid())
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    images = 32 * batches
    return {"images_per_s": images / wall, "threads": per_image_ms(before, after, images, names)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--export", type=Path, help="serve this export folder instead of a fresh resnet18 (default)")
    p.add_argument("--phone-photos", action="store_true", help="send 12-megapixel JPEGs instead of 400x300 views")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="threads-bench-"))
    folder = args.export or make_model(work)
    client = "wrk" if wrk_available() else "httpx"
    jpegs = phone_photos() if args.phone_photos else make_jpegs()
    sides = {
        "server": server_side(folder, jpegs, client, args.concurrency, args.seconds, work / "serve.log"),
        "limit": limit_side(folder, jpegs),
    }
    for name, side in sides.items():
        total = sum(side["threads"].values())
        print(f"{name}: {side['images_per_s']:.1f} images/s, {total:.1f} ms of CPU per image")
        for thread, ms in side["threads"].items():
            print(f"  {thread:<32} {ms:6.2f} ms/image")
    write_result(
        "server_threads_cpu" + ("_phone_photos" if args.phone_photos else ""),
        {
            "device": "cpu",
            "client": client,
            "concurrency": args.concurrency,
            "figures": {
                f"{name}: {thread}": f"{ms:.2f} ms of CPU per image"
                for name, side in sides.items()
                for thread, ms in side["threads"].items()
            },
            "sides": sides,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
