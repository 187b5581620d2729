"""The last step of `make demo`: serve an export folder, classify digits over HTTP, compare with eager.

    python scripts/demo_serve.py runs/demo/last.export --images 100

Starts `bentoml serve` on a free localhost port, waits for /readyz, sends validation images of the
embedded digits to POST /classify, and prints the served accuracy beside the eager model's accuracy on
the same images, the start-up time to ready, and the median single-request latency. Stops the server.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

import httpx
import torch
from PIL import Image

from harness.reference import eager_from_export
from harness.server import BentoServer
from train.data import digits_split


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("export_dir", type=Path, help="a folder written by `python -m export`")
    p.add_argument("--images", type=int, default=100, help="validation images to classify")
    args = p.parse_args()
    _, (x_val, y_val) = digits_split()
    images = [Image.fromarray(img).convert("RGB") for img in x_val[: args.images]]
    labels = [int(y) for y in y_val[: args.images]]

    model, transform = eager_from_export(args.export_dir)
    with torch.inference_mode():
        eager = model.eval()(torch.stack([transform(img) for img in images])).argmax(1).tolist()

    server = BentoServer(args.export_dir.parent / "serve.log", HANDOFF_MODEL_DIR=str(args.export_dir.resolve()))
    with server:
        ready_s = server.wait_ready()
        info = httpx.get(f"{server.url}/info", timeout=10).json()
        served, latencies = [], []
        with httpx.Client(timeout=30) as client:
            for image in images:
                buffer = io.BytesIO()
                image.save(buffer, format="PNG")
                t0 = time.perf_counter()
                response = client.post(f"{server.url}/classify", files={"image": ("digit.png", buffer.getvalue())})
                latencies.append(time.perf_counter() - t0)
                response.raise_for_status()
                served.append(response.json()["predictions"][0]["index"])

    def accuracy(predicted: list[int]) -> float:
        return 100.0 * sum(p == y for p, y in zip(predicted, labels)) / len(labels)

    agree = sum(a == b for a, b in zip(served, eager))
    print(f"served by bentoml ({info['runtime']} on {info['device']}, {info['provider']}): ready in {ready_s:.1f}s")
    print(
        f"{len(images)} digits over HTTP: served acc1 {accuracy(served):.2f}%  eager acc1 {accuracy(eager):.2f}%  "
        f"top-1 agreement {agree}/{len(images)}"
    )
    print(
        f"single-request latency (concurrency 1): median {1000 * statistics.median(latencies):.1f} ms, "
        f"max {1000 * max(latencies):.1f} ms"
    )
    print(
        f"try it in a browser: HANDOFF_MODEL_DIR={args.export_dir} .venv/bin/bentoml serve, then open http://localhost:3000/"
    )
    return 0 if agree == len(images) else 1


if __name__ == "__main__":
    sys.exit(main())
