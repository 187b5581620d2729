"""What reading one multipart upload costs the event loop: Starlette's form reader (what serve/front_door.py
used) against serve/form.py (python-multipart's parser, the parts sliced out of the body in memory).

    python bench/form_parse.py [--forms 60] [--rounds 5]

Both read the same bodies, already whole in memory as the front door holds them, on uvloop as the service
runs: 400 x 300 JPEG views (the serving benchmarks' uploads) and 12-megapixel photos (0.7-1.4 MB; Starlette
spools a file over 1 MB to a temporary file on disk and reads it back through a thread). The figure is the
wall time per form, which the event loop spends (or waits for); the two ways take turns going first
(bench/results.side_order) and the ratio is the median of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvloop
from starlette.requests import Request

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.load import BOUNDARY, multipart_body  # noqa: E402
from bench.results import side_order, write_result  # noqa: E402
from bench.workload import make_jpegs, phone_photos  # noqa: E402
from serve.form import read_form  # noqa: E402

CONTENT_TYPE = f"multipart/form-data; boundary={BOUNDARY}"
FIELDS = {"image": "file", "top_k": "integer"}


async def starlette_form(body: bytes) -> bytes:
    scope = {"type": "http", "method": "POST", "headers": [(b"content-type", CONTENT_TYPE.encode())]}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    form = await Request(scope, receive).form()
    try:
        return await form["image"].read()  # type: ignore[union-attr]
    finally:
        await form.close()


async def handoff_form(body: bytes) -> bytes:
    return read_form(CONTENT_TYPE, body, FIELDS)[0]


async def seconds_per_form(read: Callable[[bytes], Awaitable[bytes]], bodies: list[bytes], forms: int) -> float:
    started = time.perf_counter()
    for i in range(forms):
        await read(bodies[i % len(bodies)])
    return (time.perf_counter() - started) / forms


async def compare(images: list[bytes], forms: int, rounds: int) -> dict[str, list[float]]:
    bodies = [multipart_body(image) for image in images]
    ways = {"starlette": starlette_form, "handoff": handoff_form}
    for read in ways.values():  # warm, and check both read the same image
        assert [await read(body) for body in bodies] == images
    figures: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(rounds):
        for name in side_order(list(ways), round_):
            figures[name].append(await seconds_per_form(ways[name], bodies, forms))
    return figures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--forms", type=int, default=60, help="forms read per way, workload and round")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    workloads = {"400x300 JPEG views": make_jpegs(), "4032x3024 photos": phone_photos()}
    figures_out: dict[str, str] = {}
    ratios: dict[str, float] = {}
    for workload, images in workloads.items():
        figures = uvloop.run(compare(images, args.forms, args.rounds))
        ratio = statistics.median(s / h for s, h in zip(figures["starlette"], figures["handoff"], strict=True))
        sizes = sorted(len(image) for image in images)
        print(f"{workload} ({sizes[0] / 1e3:.0f}-{sizes[-1] / 1e3:.0f} KB):")
        for name, values in figures.items():
            print(f"  {name:<10} {1e3 * statistics.median(values):6.3f} ms per form (median of {args.rounds} rounds)")
        print(f"  starlette / handoff: {ratio:.2f} x (median of the rounds' ratios)")
        for name, values in figures.items():
            figures_out[f"{workload} ({sizes[0] / 1e3:.0f}-{sizes[-1] / 1e3:.0f} KB), {name}"] = (
                f"{1e3 * statistics.median(values):.3f} ms per form (median of {args.rounds} rounds)"
            )
        ratios[f"{workload}: Starlette's time per form over handoff's"] = ratio
    path = write_result(
        "form_parse_cpu", {"rounds": args.rounds, "forms": args.forms, "figures": figures_out, "ratios": ratios}
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
