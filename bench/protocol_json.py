"""One image at a time: the protocol's JSON infer of a 3 x 224 x 224 tensor against raw-body /classify.

    python bench/protocol_json.py [--requests 40]

Model: resnet18 at 224 px (bench/workload.py), one `bentoml serve`, concurrency 1. For each JPEG view, in turn:
its raw body to /classify (the service decodes and preprocesses it), the same image preprocessed by the
client and sent as JSON `data` (150,528 numbers, about 3 MB of text), and the same tensor through the binary
extension. Reported: the median latency of each (a median of requests, one run), the JSON's cost over
/classify, and what parsing such a body costs in process (json.loads and the conversion, no HTTP), which is
the part of the gap that is JSON itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.load import uploads  # noqa: E402
from bench.results import write_result  # noqa: E402
from bench.workload import make_jpegs, make_model  # noqa: E402
from export.manifest import read_manifest  # noqa: E402
from harness.server import BentoServer  # noqa: E402
from serve.oip_codec import parse_infer_request  # noqa: E402
from train.pil_transform import Preprocessor  # noqa: E402

GOAL_MS = 5.0  # the issue's: JSON of one 3x224x224 image at c=1 within 5 ms of /classify


def json_body(tensor: np.ndarray) -> bytes:
    shape = [1, *tensor.shape]
    return json.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": shape, "data": tensor.reshape(-1).tolist()}]}
    ).encode()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=40, help="requests of each kind")
    p.add_argument("--results-dir", type=Path, default=None)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="protocol-json-"))
    folder = make_model(work)
    preprocess = Preprocessor.from_manifest(read_manifest(folder)["preprocess"], max_pixels=10**9)
    jpegs = make_jpegs(8)
    tensors = [preprocess(preprocess.decode(jpeg)) for jpeg in jpegs]
    raw, binary = uploads(jpegs, "raw"), uploads(tensors, "oip_tensor")
    bodies = [json_body(t) for t in tensors]
    parse_ms = []
    for body in bodies:
        started = time.perf_counter()
        parse_infer_request(body, None)
        parse_ms.append(1000 * (time.perf_counter() - started))
    kinds: dict[str, list[float]] = {"classify_raw": [], "oip_json": [], "oip_binary": []}
    with BentoServer(work / "serve.log", HANDOFF_MODEL_DIR=str(folder)) as server, httpx.Client(timeout=60) as client:
        server.wait_ready()
        infer = f"{server.url}/v2/models/handoff/infer"
        sends = {
            "classify_raw": lambda k: client.post(
                f"{server.url}/classify", content=raw[k].body, headers=raw[k].headers
            ),
            "oip_json": lambda k: client.post(infer, content=bodies[k]),
            "oip_binary": lambda k: client.post(infer, content=binary[k].body, headers=binary[k].headers),
        }
        for i in range(args.requests + 4):  # the first 4 of each warm up
            for kind, send in sends.items():
                started = time.perf_counter()
                send(i % len(jpegs)).raise_for_status()
                if i >= 4:
                    kinds[kind].append(1000 * (time.perf_counter() - started))
    p50 = {kind: statistics.median(values) for kind, values in kinds.items()}
    gap = p50["oip_json"] - p50["classify_raw"]
    mb = statistics.mean(len(b) for b in bodies) / 1e6
    parsed = statistics.median(parse_ms)
    print(f"JSON body of one 3x224x224 tensor: {mb:.1f} MB; parsed and checked in process: {parsed:.1f} ms")
    for kind, value in p50.items():
        print(f"  {kind:<13} c=1 p50 {value:6.1f} ms (median of {args.requests} requests)")
    print(f"oip_json minus classify_raw: {gap:+.1f} ms; goal {GOAL_MS:g} ms: {'met' if gap <= GOAL_MS else 'NOT met'}")
    write_result(
        "protocol_json_cpu",
        folder=args.results_dir,
        figures={
            "requests": args.requests,
            "json_mb": mb,
            "parse_ms_in_process": statistics.median(parse_ms),
            "p50_ms": p50,
            "seconds": {f"{k}_p50_c1": v / 1000 for k, v in p50.items()},
            "figures": {"oip_json minus classify_raw at c=1": f"{gap:+.1f} ms"},
            "goal": f"JSON of one 3x224x224 image at c=1 within {GOAL_MS:g} ms of raw-body /classify",
            "goal_met": gap <= GOAL_MS,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
