"""What handoff's own Python costs a request, apart from HTTP and the model.

The protocol's binary infer of one image classifier row is called in process through the service's middlewares,
router, front door, task and codec (what uvicorn calls for it), with the model's batcher answering at once. Beside
it, the floor's handler (bench/peer/oip_tensor.py: the tensor read from the body and the logits answered, no checks,
as the floors below and above ASGI serve it) with the same instant answer. One thread, no socket, no model: the
figures hold still where served ones swing by a fifth on a shared 2-core host, so a change to a request's Python
path is A/B'd here (`--baseline DIR`: another checkout, its own process each round, the order alternating).

    python -m bench app_path [--export runs/demo/last.export] [--baseline DIR] [--rounds 5]
    python bench/app_path.py --garbage [--export DIR]     # the cyclic garbage a request leaves, by kind

The service lets the garbage collector's youngest generation grow far past Python's default (serve/service.py),
because a request leaves no cyclic garbage of its own: `--garbage` shows it, for a request answered and for each
kind refused, through the connection's protocol with the collector off (tests/test_serve.py holds it to 0).

Each side prints the CPU microseconds a request costs entered at each of handoff's middlewares (so what each layer
adds), at the connection's protocol (the request's bytes handed to the guarded uvicorn protocol the worker serves
with, on a transport that keeps what is written: uvicorn's parsing, request cycle and answer besides), and at the
floor's handler, counted for the whole process: the access log's writer thread included. The metrics are kept in
files and the logging configured as BentoML's server does for a worker. The model's batcher and the socket are
left out on purpose: they are the same code for every change this A/Bs; bench/serve_throughput.py measures them
served (the event loop's CPU a request among them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.results import median_of_rounds, print_ratios, side_order, write_result  # noqa: E402
from bench.workload import make_model, workload_name  # noqa: E402

OURS, FLOOR, BASELINE = "ours", "floor_handler", "at_"
PROTOCOL = "from the connection's protocol"
REQUESTS = 3000  # a request costs tens of microseconds: a timed pass takes a fraction of a second
GARBAGE_REQUESTS = 200  # of each kind, with the garbage collector off
PASSES = 3  # each figure is the least of these passes (the code is deterministic; only the host's noise varies)


def measure(checkout: Path, folder: Path, requests: int, garbage: bool = False) -> dict[str, float]:
    """In this process: CPU microseconds a request, entered at each middleware of `checkout`'s service, and the
    floor's handler; or, with `garbage`, the cyclic garbage a request leaves by kind (`left_garbage`). Imports
    `checkout`'s serve/ (so one side per process)."""
    os.environ.update(HANDOFF_MODEL_DIR=str(folder), HANDOFF_DEVICE="cpu", HANDOFF_WORKERS="1", HANDOFF_LANES="1")
    # As BentoML's server runs a worker: the metrics in files (its multiprocess mode: PROMETHEUS_MULTIPROC_DIR, which
    # `one_round` gives each process), its logging configured (so the access line is made and written, by its thread,
    # whose CPU counts too).
    sys.path.insert(0, str(checkout))

    import numpy as np
    import orjson
    import uvloop
    from _bentoml_sdk.service import set_current_service  # as BentoML's worker sets the instance it serves
    from bentoml._internal.log import configure_server_logging

    import serve.service as served
    from bench.peer.oip_tensor import answer_of, rows_of
    from contract.manifest import read_manifest_unchecked
    from serve.tasks.ranking import ranked

    configure_server_logging()
    service = served.SERVICE.inner()
    if service.load_failure:
        raise SystemExit(f"app_path: the service did not load {folder}: {service.load_failure}")
    set_current_service(service)
    service.patches_in_effect = True  # no server runs here to show uvicorn's and BentoML's replacements took
    manifest = read_manifest_unchecked(folder)
    shape = [1, *manifest["input"]["shape"][1:]]
    # as many logits as the model answers: their encoding is part of the path
    logits = np.random.default_rng(0).random((1, manifest["num_classes"]), dtype=np.float32)
    answer = ranked(logits)

    async def instant(rows: Any) -> dict[str, np.ndarray]:
        return answer

    service.batched = instant  # the task holds the service's `batched` in its Serving: both answer at once
    service.task.serving = type(service.task.serving)(**{**vars(service.task.serving), "batched": instant})

    pixels = np.random.default_rng(1).random(shape, dtype=np.float32)
    tensor = {"name": "input", "datatype": "FP32", "shape": shape, "parameters": {"binary_data_size": pixels.nbytes}}
    header = orjson.dumps({"inputs": [tensor]})
    body, header_length = header + pixels.tobytes(), str(len(header)).encode()
    path = f"/v2/models/{served.CONFIG.model_name}/infer"
    headers = [
        (b"host", b"localhost"),
        (b"content-type", b"application/octet-stream"),
        (b"inference-header-content-length", header_length),
        (b"content-length", str(len(body)).encode()),
    ]

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and message["status"] != 200:
            raise SystemExit(f"app_path: the service answered {message['status']}")

    async def bentoml_app(scope: Any, receive: Any, send: Any) -> None:
        raise SystemExit("app_path: the infer route reached BentoML's app")

    def scope() -> dict[str, Any]:  # as uvicorn makes it
        return {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "server": ("127.0.0.1", 3000),
            "client": ("127.0.0.1", 50000), "scheme": "http", "method": "POST", "root_path": "", "path": path,
            "raw_path": path.encode(), "query_string": b"", "headers": headers, "state": {},
        }  # fmt: skip

    async def floor_handler() -> None:
        outputs = await instant(rows_of(body, int(header_length)))
        answer_of(outputs["logits"])

    def entered_at(app: Any) -> Callable[[], Awaitable[None]]:
        async def call() -> None:
            await app(scope(), receive, send)

        return call

    front = served.FRONT
    if front is None:
        raise SystemExit("app_path: BentoML's configuration traces, so BentoML's app calls the middlewares")
    if garbage:
        return uvloop.run(left_garbage(refused_kinds(path, headers, body, len(header)), bentoml_app))
    entries: dict[str, Callable[[], Awaitable[None]]] = {
        FLOOR: floor_handler,
        PROTOCOL: connection(raw_request(path, headers, body), bentoml_app),
    }
    for i, (middleware, _) in enumerate(front.middlewares):
        app = type(front)(front.middlewares[i:]).stack(bentoml_app)
        entries[f"from {middleware.__name__}"] = entered_at(app)

    async def timed() -> dict[str, float]:
        least: dict[str, float] = {}
        for _ in range(PASSES):
            for name, call in entries.items():
                for _ in range(requests // 10):  # warm
                    await call()
                started = time.process_time()
                for _ in range(requests):
                    await call()
                spent = (time.process_time() - started) / requests * 1e6
                least[name] = min(spent, least.get(name, spent))
        return least

    return uvloop.run(timed())


def raw_request(path: str, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
    """The request's bytes as a client sends them, its Content-Length the body's."""
    sent = [*(h for h in headers if h[0] != b"content-length"), (b"content-length", str(len(body)).encode())]
    return b"POST %s HTTP/1.1\r\n" % path.encode() + b"".join(b"%s: %s\r\n" % h for h in sent) + b"\r\n" + body


def refused_kinds(
    path: str, headers: list[tuple[bytes, bytes]], body: bytes, header_length: int
) -> dict[str, tuple[bytes, bytes]]:
    """The binary infer answered, and refused for each of the reasons a client can give: {kind: (request, status)}."""
    nan = bytearray(body)
    nan[header_length : header_length + 4] = b"\x00\x00\xc0\x7f"  # a float32 NaN, little-endian
    typed = [(k, b"text/plain" if k == b"content-type" else v) for k, v in headers]
    return {
        "answered": (raw_request(path, headers, body), b"200"),
        "NaN in the tensor": (raw_request(path, headers, bytes(nan)), b"400"),
        "JSON header broken": (raw_request(path, headers, b"[" + body[1:]), b"400"),
        "unknown path": (raw_request(path + "x", headers, body), b"404"),
        "wrong Content-Type": (raw_request(path, typed, body), b"415"),
    }


async def left_garbage(kinds: dict[str, tuple[bytes, bytes]], inner_app: Any) -> dict[str, float]:
    """Objects the garbage collector finds unreachable a request of each kind (none: reference counting freed all
    it made), the collector off while GARBAGE_REQUESTS of them are answered."""
    import gc

    left = {}
    for kind, (request, status) in kinds.items():
        call = connection(request, inner_app, status)
        for _ in range(20):  # what is made once (a metric's labelled series, a cached message) is made first
            await call()
        gc.collect()
        gc.disable()
        try:
            for _ in range(GARBAGE_REQUESTS):
                await call()
            left[kind] = gc.collect() / GARBAGE_REQUESTS
        finally:
            gc.enable()
    return left


class _KeptTransport:
    """A connection's transport for a protocol called in process: what is written is checked, nothing is sent."""

    def __init__(self) -> None:
        self.status = b""

    def write(self, data: bytes) -> None:
        if data.startswith(b"HTTP/"):
            self.status = data[9:12]

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 3000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None:
        raise SystemExit("app_path: the protocol closed the connection")


def connection(request: bytes, inner_app: Any, status: bytes = b"200") -> Callable[[], Awaitable[None]]:
    """A request's bytes handed to the protocol class the worker serves with (uvicorn's, guarded and calling
    handoff's middlewares, serve/patches.py), on one kept-alive connection; returns when its answer (of `status`)
    is written."""
    import asyncio

    from uvicorn.config import Config
    from uvicorn.protocols.http import auto
    from uvicorn.server import ServerState

    class Answered(auto.AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        done: asyncio.Future[None]

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self.done.set_result(None)

    if not getattr(auto.AutoHTTPProtocol, "handoff_guarded", False):
        raise SystemExit("app_path: uvicorn's protocol is not handoff's guarded one (serve/patches.py)")
    config = Config(inner_app, log_config=None, lifespan="off")  # its proxy-header wrapper, as the worker's
    config.load()
    protocol, transport = None, _KeptTransport()

    async def call() -> None:
        nonlocal protocol
        if protocol is None:
            protocol = Answered(config, ServerState(), {}, asyncio.get_running_loop())
            protocol.connection_made(transport)
        protocol.done = asyncio.get_running_loop().create_future()
        protocol.data_received(request)
        await protocol.done
        if transport.status != status:
            raise SystemExit(f"app_path: the protocol answered {transport.status.decode()}, not {status.decode()}")

    return call


def one_round(checkout: Path, folder: Path, requests: int) -> dict[str, float]:
    """`measure` in a process of its own (the service is a module-level BentoML service: one per process)."""
    command = [
        sys.executable,
        __file__,
        "--measure",
        str(checkout),
        "--export",
        str(folder),
        "--requests",
        str(requests),
    ]
    with tempfile.TemporaryDirectory(prefix="app-path-metrics-") as metrics:
        done = subprocess.run(
            command,
            cwd=ROOT,
            env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": metrics},
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        raise SystemExit(f"app_path: measuring {checkout} failed:\n{done.stderr[-2000:]}")
    return figures_printed(done.stdout)


def figures_printed(stdout: str) -> dict[str, float]:
    """The figures a measuring process printed: its last JSON line (the access log's last lines may follow it)."""
    return json.loads(next(line for line in reversed(stdout.splitlines()) if line.startswith("{")))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--export", type=Path, help="an image classifier's export folder (default: a fresh resnet18)")
    p.add_argument("--rounds", type=int, default=5, help="processes per side, alternating with the baseline's")
    p.add_argument("--requests", type=int, default=REQUESTS, help="requests a timed pass")
    p.add_argument("--baseline", type=Path, action="append", default=[], help="another checkout to A/B against")
    p.add_argument("--results-dir", type=Path, default=None, help="where the JSON goes (default: bench/results)")
    p.add_argument("--garbage", action="store_true", help="print the cyclic garbage a request leaves, by kind")
    p.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # in the child: this checkout's figures
    args = p.parse_args(argv)
    if args.measure or args.garbage:
        if args.garbage and args.export is None:
            p.error("--garbage needs --export (an image classifier's export folder)")
        print(json.dumps(measure(args.measure or ROOT, args.export.resolve(), args.requests, args.garbage)))
        return 0
    folder = args.export.resolve() if args.export else make_model(Path(tempfile.mkdtemp(prefix="app-path-")))
    checkouts = {OURS: ROOT, **{f"{BASELINE}{path.name}": path.resolve() for path in args.baseline}}
    rounds = []
    for round_ in range(args.rounds):
        order = side_order(list(checkouts), round_)
        measured = {name: one_round(checkouts[name], folder, args.requests) for name in order}
        spans = (f"{name} {min(f.values()):.1f}-{max(f.values()):.1f} us" for name, f in measured.items())
        print(f"round {round_ + 1}/{args.rounds}: {', '.join(spans)}")
        rounds.append({name: measured[name] for name in checkouts})
    median = median_of_rounds(rounds)
    for name, entries in median.items():
        print(f"{name}: CPU us a request, median of {args.rounds} rounds")
        for entry, us in entries.items():
            print(f"  {entry:<32} {us:7.1f}")
    outermost = next(k for k in median[OURS] if k not in (FLOOR, PROTOCOL))
    ratios = {
        f"{OURS}_over_{FLOOR}": median[OURS][outermost] / median[OURS][FLOOR],
        f"{OURS}_protocol_over_middlewares": median[OURS][PROTOCOL] / median[OURS][outermost],
    }
    for name in checkouts:
        if name != OURS:
            ratios[f"{OURS}_over_{name}"] = median[OURS][outermost] / median[name][outermost]
    print_ratios(ratios)
    figures: dict[str, Any] = {
        "device": "cpu",
        "rounds": args.rounds,
        "requests": args.requests,
        "per_round": rounds,
        "median": median,
    }
    write_result("app_path", {**figures, "ratios": ratios}, workload_name(args.export), args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
