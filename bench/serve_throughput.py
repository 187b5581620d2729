"""Serving efficiency: our service against the in-process limit and two plain BentoML services.

    python bench/serve_throughput.py [--device cpu|cuda] [--seconds 8] [--rounds 3] [--client wrk|httpx]

Model: resnet18 at 224 px, 1000 classes, random weights, exported by `python -m export` (or --export DIR).
Sides, each given the whole machine in turn (one server at a time: an idle BentoML server still takes CPU):
- limit: bench/limit.py, no HTTP: the service's preprocessing and session settings; the fastest of serial,
  overlapped (thread-pool) decoding and one lane per core over batch sizes 1-32, timed again for --seconds;
- peer_minimal: bench/peer/minimal.py, a synchronous endpoint, one model call per request;
- peer_batched: bench/peer/batched.py, what BentoML's adaptive-batching guide leads to (`batchable=True`,
  async), with our preprocessing and session settings;
- ours: `bentoml serve` with serve/service.py, the same multipart uploads;
- ours_raw_body: the same service sent each JPEG as the body itself (`Content-Type: image/jpeg`);
- ours_oip_image: the same service and JPEGs through the Open Inference Protocol's binary infer, each JPEG a
  BYTES `image` (as tritonclient sends it);
- ours_oip_tensor: the protocol's binary infer with each image already preprocessed, an FP32 `input` (the
  same images, the decoding done by the client);
- ours_oip_json: the same tensors as the protocol's JSON form (`"data"` lists of numbers);
- peer_floor: bench/peer/floor.py, a bare ASGI app (Starlette on uvicorn) with the same decoding, batcher and
  session and nothing else: the least a Python HTTP server costs here (raw JPEG bodies);
- ours_with_spans: ours_raw_body with BentoML's per-request OpenTelemetry span kept, as BentoML ships it
  (tracing configured with a sample rate so small that nothing is exported): the A/B for serve/observability/tracing.py;
- peer_litserve: bench/peer/litserve_peer.py, LitServe with its batching on (max_batch_size 32, batch_timeout
  10 ms), the same decoding and session, the same multipart uploads as `ours`;
- peer_triton (CPU only): bench/peer/triton_peer.py, NVIDIA Triton's own server (the one nvidia-pytriton bundles)
  with its dynamic batcher, the model in its Python backend on the same session settings, sent the same protocol
  binary infers as ours_oip_tensor;
- peer_triton_image (CPU only): the same Triton, its model taking each JPEG as a BYTES `image` and decoding it with
  the service's own preprocessing on a thread per core, sent the same binary infers as ours_oip_image (the JPEGs
  themselves: what /classify and ours_oip_image take);
- peer_floor_tensor: the floor sent the same protocol binary infers as ours_oip_tensor (Starlette on uvicorn: the
  least an ASGI server costs such a request);
- peer_protocol_floor: bench/peer/protocol_floor.py, the floor below ASGI (an asyncio Protocol parsing HTTP
  with httptools, the same batcher and session), sent the same protocol binary infers as ours_oip_tensor: the
  least a Python front end costs a request, beside Triton's C++ one;
- peer_protocol_floor_jpeg: the same floor below ASGI sent each JPEG as the body of /classify, decoded as the
  floor decodes it: the least a Python front end costs a JPEG, beside the limit;
- peer_kserve (CPU only): bench/peer/kserve_peer.py, KServe's model server with a `kserve.Model` (no batching of
  its own), the same binary infers;
- peer_ray (CPU only): bench/peer/ray_peer.py, Ray Serve with `@serve.batch`, the same binary infers;
- peer_mlserver (CPU only): bench/peer/mlserver_peer.py, MLServer with its adaptive batching, sent the protocol's
  JSON form (all its REST endpoint takes), as ours_oip_json is;
- ours_per_core (CPU only): the same service and uploads as `ours`, with one worker per core
  (HANDOFF_WORKERS; each worker's model then runs on one thread);
- ours_oip_tensor_per_core (CPU only): ours_oip_tensor's binary infers to one worker per core, beside Triton;
- at_NAME (with --baseline DIR): the service of another checkout of handoff (`git worktree add DIR COMMIT`),
  served and loaded as ours_raw_body (or, with --baseline-form multipart or oip_tensor, as ours or
  ours_oip_tensor): the A/B of a change to the service, in the same rounds.
Each round measures the limit, then starts, loads and stops every service (the order rotates from round to
round and reverses in every other pair of rounds: bench/results.side_order); figures are medians over rounds,
and each side at c=64 is also divided by its own round's limit, round by round (paired, so drift between rounds
cancels).
Load: JPEG uploads at concurrency 1, 16 and 64 for --seconds each, by bench/load.py (wrk when installed, else
httpx), with the client's and the server's CPU per image.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.checks import assert_provider  # noqa: E402
from bench.limit import InProcessModel, limit_round  # noqa: E402
from bench.load import Upload, load_levels, uploads, wrk_available  # noqa: E402
from bench.peer.floor import floor_server  # noqa: E402
from bench.peer.kserve_peer import KServeServer  # noqa: E402
from bench.peer.litserve_peer import litserve_server  # noqa: E402
from bench.peer.mlserver_peer import MLServerServer  # noqa: E402
from bench.peer.ray_peer import RayServeServer  # noqa: E402
from bench.peer.triton_peer import TritonServer  # noqa: E402
from bench.results import median_of_rounds, print_goal, print_ratios  # noqa: E402
from bench.serving import (  # noqa: E402
    BASELINE,
    SERVERS_INSTEAD,
    is_ours,
    measure_rounds,
    over_limit,
    over_peers,
    paired_over_limit,
    print_sides,
    served_provider,
    write_serving_result,
)
from bench.workload import make_jpegs, make_model  # noqa: E402
from contract.manifest import read_manifest  # noqa: E402
from contract.pil_transform import Preprocessor  # noqa: E402
from harness.server import BentoServer, ScriptServer  # noqa: E402
from serve.config import usable_cores  # noqa: E402

CONCURRENCY = (1, 16, 64)
SERVICES = (
    "peer_minimal",
    "peer_floor",
    "peer_litserve",
    "peer_batched",
    "ours",
    "ours_raw_body",
    "ours_oip_image",
    "ours_oip_tensor",
    "ours_with_spans",
    "ours_per_core",
    "ours_oip_tensor_per_core",
    "peer_triton",
    "peer_triton_image",
    "peer_floor_tensor",
    "peer_protocol_floor",
    "peer_protocol_floor_jpeg",
    "peer_kserve",
    "peer_ray",
    "peer_mlserver",
    "ours_oip_json",
)
OURS = (
    "ours",
    "ours_raw_body",
    "ours_oip_image",
    "ours_oip_tensor",
    "ours_oip_json",
    "ours_with_spans",
    "ours_per_core",
    "ours_oip_tensor_per_core",
)
PEER_SIDES = tuple(name for name in SERVICES if name not in OURS)
PREPROCESSED = ("oip_tensor", "oip_json")  # forms whose client sends the preprocessed tensor, not the JPEG
# What each side sends for an image (bench/load.py's forms); the others send the multipart form.
FORM = {
    "peer_floor": "raw",
    "ours_raw_body": "raw",
    "ours_with_spans": "raw",
    "ours_oip_image": "oip_image",
    "ours_oip_tensor": "oip_tensor",
    "ours_oip_tensor_per_core": "oip_tensor",
    "peer_triton": "oip_tensor",
    "peer_triton_image": "oip_image",
    "peer_floor_tensor": "oip_tensor",
    "peer_protocol_floor": "oip_tensor",
    "peer_protocol_floor_jpeg": "raw",
    "peer_kserve": "oip_tensor",
    "peer_ray": "oip_tensor",
    "peer_mlserver": "oip_json",
    "ours_oip_json": "oip_json",
}
# one worker per core is a CPU arrangement (on a GPU host it is one per GPU); LitServe is installed from PyPI
# when first run, which the GPU machine (no internet) cannot do
CPU_ONLY = (
    "ours_per_core",
    "ours_oip_tensor_per_core",
    "peer_litserve",
    "peer_triton",
    "peer_triton_image",
    "peer_kserve",
    "peer_ray",
    "peer_mlserver",
)
# tracing "configured" (serve/observability/tracing.py keeps the span middleware) with next to no trace ever sampled
SPANS_KEPT = "tracing.exporter_type=in_memory tracing.sample_rate=0.000001"
GOAL = (
    "CPU: ours (a form that sends JPEGs) >= 0.9 x limit at c=64 and p50(c=1) within 3 ms of in-process; "
    "GPU: >= 2 x peer_minimal at c=64"
)


PEERS = {"peer_minimal": "minimal:MinimalPeer", "peer_batched": "batched:BatchedPeer"}


def default_sides(device: str) -> list[str]:
    """Every side for the device but the servers instead and the sides measured beside them (JSON, per core):
    those are asked for by name, each server installing its own virtualenv on first use."""
    opt_in = (
        *SERVERS_INSTEAD,
        "ours_oip_json",
        "ours_oip_tensor_per_core",
        "peer_floor_tensor",
        "peer_protocol_floor",
        "peer_protocol_floor_jpeg",
    )
    return [name for name in SERVICES if (device == "cpu" or name not in CPU_ONLY) and name not in opt_in]


def start(name: str, folder: Path, device: str, log: Path, checkout: Path = ROOT) -> BentoServer:
    if name in ("peer_floor", "peer_floor_tensor"):
        return floor_server(log, folder, device)
    if name == "peer_litserve":
        return litserve_server(log, folder, device)
    if name in ("peer_protocol_floor", "peer_protocol_floor_jpeg"):
        return ScriptServer(log, ROOT / "bench" / "peer" / "protocol_floor.py", str(folder), device)
    if name in ("peer_triton", "peer_triton_image"):
        return TritonServer(log, folder, images=name == "peer_triton_image")
    if name == "peer_kserve":
        return KServeServer(log, folder)
    if name == "peer_ray":
        return RayServeServer(log, folder)
    if name == "peer_mlserver":
        return MLServerServer(log, folder)
    if is_ours(name):
        workers = usable_cores() if name.endswith("_per_core") else 1
        spans = {"BENTOML_CONFIG_OPTIONS": SPANS_KEPT} if name == "ours_with_spans" else {}
        return BentoServer(
            log,
            target=None,
            cwd=checkout,  # `python -m bentoml` imports the service from its working directory first
            bentoml=None,
            HANDOFF_MODEL_DIR=str(folder),
            HANDOFF_DEVICE=device,
            HANDOFF_WORKERS=str(workers),
            **spans,
        )
    return BentoServer(
        log, target=PEERS[name], cwd=ROOT / "bench" / "peer", PEER_MODEL_DIR=str(folder), PEER_DEVICE=device
    )


def requests_for(name: str, folder: Path, jpegs: list[bytes], baseline_form: str = "raw") -> list[Upload]:
    """What side `name` sends for each JPEG: its form of the same images."""
    form = baseline_form if name.startswith(BASELINE) else FORM.get(name, "multipart")
    if form not in ("oip_tensor", "oip_json"):
        return uploads(jpegs, form)
    preprocess = Preprocessor.from_manifest(read_manifest(folder)["preprocess"], max_pixels=10**9)
    return uploads([preprocess(preprocess.decode(jpeg)) for jpeg in jpegs], form)


def measure_service(
    name: str, folder: Path, device: str, log: Path, jpegs: list[bytes], args: Any, checkout: Path = ROOT
) -> dict:
    with start(name, folder, device, log, checkout) as server:
        result: dict[str, Any] = {"ready_s": server.wait_ready()}  # launch to /readyz 200, warm-up included
        assert_provider(name, [served_provider(name, server.url)], device)
        requests = requests_for(name, folder, jpegs, args.baseline_form)
        result.update(load_levels(args.client, server.url, server.proc.pid, requests, CONCURRENCY, args.seconds))
        return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--seconds", type=float, default=8.0, help="load per concurrency level, side and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--client", choices=("wrk", "httpx"), default="wrk" if wrk_available() else "httpx")
    p.add_argument(
        "--sides",
        nargs="+",
        choices=SERVICES,
        help="services to measure (default: all for the device but the servers instead, peer_triton, peer_kserve, "
        "peer_ray, peer_mlserver, and ours_oip_json, which are asked for by name)",
    )
    p.add_argument("--export", type=Path, help="serve this export folder instead of a fresh resnet18 (default)")
    p.add_argument("--results-dir", type=Path, default=None, help="where the JSON goes (default: bench/results)")
    p.add_argument(
        "--baseline",
        type=Path,
        nargs="+",
        default=[],
        help="also serve these checkouts of handoff (git worktree add DIR COMMIT) as sides at_DIRNAME",
    )
    p.add_argument(
        "--baseline-form",
        choices=("raw", "multipart", "oip_tensor"),
        default="raw",
        help="what the --baseline sides are sent: raw JPEG bodies (as ours_raw_body), the multipart form (as ours) or "
        "the protocol's binary infers of the preprocessed tensors (as ours_oip_tensor)",
    )
    args = p.parse_args(argv)
    checkouts = {f"{BASELINE}{path.name}": path.resolve() for path in args.baseline}
    args.sides = (args.sides or default_sides(args.device)) + list(checkouts)
    work = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    folder = args.export.resolve() if args.export else make_model(work)
    jpegs = make_jpegs()
    model = InProcessModel(folder, args.device)

    def side(name: str, round_: int, _: dict[str, Any]) -> dict[str, Any]:
        log = work / f"{name}{round_}.log"
        return measure_service(name, folder, args.device, log, jpegs, args, checkouts.get(name, ROOT))

    rounds = measure_rounds(args.rounds, args.sides, lambda: limit_round(model, jpegs, args.seconds), side)
    median = median_of_rounds(rounds)
    limit = median["limit"]
    print(
        f"limit (in-process, median of {args.rounds} rounds): {limit['images_per_s']:.1f} images/s "
        f"({limit['cpu_ms_per_image']:.1f} ms CPU per image); single image {limit['single_image_ms']:.1f} ms; "
        f"best arrangement per round: {', '.join(r['limit']['best'] for r in rounds)}"
    )
    print_sides(median, args.sides, CONCURRENCY)
    our_sides = [n for n in OURS if n in args.sides]
    ratios = over_limit(median, args.sides, CONCURRENCY)
    ratios |= over_peers(median, our_sides, [p for p in PEER_SIDES if p in args.sides] + list(checkouts), CONCURRENCY)
    # the protocol's goal: as fast as raw-body /classify; and the span middleware's cost
    for name in ("ours_oip_image", "ours_oip_tensor", "ours_with_spans"):
        if name in args.sides and "ours_raw_body" in args.sides:
            ratios |= over_peers(median, [name], ["ours_raw_body"], [64])
    # against the servers a user would pick instead (issue 57): a lone request's latency and the CPU per request
    for ours in our_sides:
        for peer in (p for p in SERVERS_INSTEAD if p in args.sides):
            ratios[f"{ours}_p50_c1_over_{peer}"] = median[ours]["1"]["p50_ms"] / median[peer]["1"]["p50_ms"]
            ratios[f"{ours}_server_cpu_over_{peer}_c64"] = (
                median[ours]["64"]["server_cpu_ms_per_image"] / median[peer]["64"]["server_cpu_ms_per_image"]
            )
    for name in args.sides:
        at_64 = median[name]["64"]
        # the serving stack's CPU per image against the model's alone (the client aside)
        ratios[f"{name}_server_cpu_over_limit_cpu_c64"] = at_64["server_cpu_ms_per_image"] / limit["cpu_ms_per_image"]
        # the figure before the steady rate (bench/load.py): answers / window, ramp included
        ratios[f"{name}_whole_window_over_limit_c64"] = at_64["images_per_s_whole_window"] / limit["images_per_s"]
    print_ratios(ratios)
    figures: dict[str, str] = {"client": args.client, **paired_over_limit(rounds, args.sides)}
    met_by = []  # the upload forms of ours that meet the goal
    for ours in (n for n in OURS if n in args.sides):
        added_ms = median[ours]["1"]["p50_ms"] - limit["single_image_ms"]
        print(f"  {ours} p50 at c=1 minus the in-process single image: {added_ms:+.1f} ms")
        figures[f"{ours} p50 at c=1 minus in-process single image"] = f"{added_ms:+.1f} ms"
        figures[f"client CPU share of the machine, {ours} at c=64"] = (
            f"{100 * median[ours]['64']['client_cpu_share']:.1f}%"
        )
        decodes = FORM.get(ours) not in PREPROCESSED  # the limit decodes JPEGs: held only against a side that does
        if args.device == "cpu" and decodes and ratios[f"{ours}_over_limit_c64"] >= 0.9 and added_ms <= 3:
            met_by.append(ours)
        if args.device == "cuda" and ratios.get(f"{ours}_over_peer_minimal_c64", 0) >= 2:
            met_by.append(ours)
    goal = bool(met_by) if any(n in args.sides for n in OURS) else None
    figures["goal met by"] = ", ".join(met_by) or "none"
    print_goal(GOAL, goal)
    seconds = {
        "limit_single_image": limit["single_image_ms"] / 1000,
        "limit_cpu_per_image": limit["cpu_ms_per_image"] / 1000,
    }
    for name in args.sides:
        seconds[f"{name}_p50_c1"] = median[name]["1"]["p50_ms"] / 1000
        seconds[f"{name}_p99_c64"] = median[name]["64"]["p99_ms"] / 1000
        seconds[f"{name}_server_cpu_per_image_c64"] = median[name]["64"]["server_cpu_ms_per_image"] / 1000
        seconds[f"{name}_launch_to_ready"] = median[name]["ready_s"]
    report = {"ratios": ratios, "seconds": seconds, "figures": figures, "goal": GOAL, "goal_met": goal}
    # measured against the servers a user would pick instead: a result of its own beside the default sides'
    instead = "servers-instead" if any(p in args.sides for p in SERVERS_INSTEAD) else ""
    write_serving_result("serve_throughput", args, rounds, median, args.sides, report, instead)
    return 0


if __name__ == "__main__":
    sys.exit(main())
