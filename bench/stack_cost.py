"""What each layer of the service's middleware chain costs the event loop per request: BentoML's own classes
against the ones handoff puts in their place, in process, on uvloop, with no sockets, decoding or model.

    python bench/stack_cost.py [--requests 4000] [--concurrency 16] [--rounds 9]

A request is a raw 20 KB body POSTed to /classify through serve/front_door.py to a handler that answers a
small JSON document at once. The chain is built up a layer at a time, outermost last, as BentoML orders it:
the API-key gate (no keys), the response deadline, the access log, the request metrics, Starlette's error
middleware. Each layer is measured twice, as BentoML ships it and as handoff replaces it:
- deadline: bentoml's TimeoutMiddleware / serve/deadline.py;
- access log: bentoml's AccessLogMiddleware (its record handed to a queue, as serve/access_log.py's writer
  would write it) / serve/access_log.py, its writer thread running;
- metrics: bentoml's RunnerTrafficMetricsMiddleware (Prometheus in multiprocess mode, as BentoML runs it) /
  serve/request_metrics.py.
The figure is the event loop thread's CPU time per request (`time.thread_time`), so the access log's writer
thread is not counted: it is work moved off the loop, onto another core. Rounds alternate the chains; each
figure is a median of rounds. What HTTP parsing, decoding and the model cost comes on top: see
bench/serve_throughput.py and bench/server_threads.py.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import queue
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from logging.handlers import QueueHandler
from pathlib import Path
from typing import Any

os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="stack-cost-metrics-"))
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import uvloop  # noqa: E402
from bentoml._internal.server.http import access, instruments, traffic  # noqa: E402
from starlette.middleware.errors import ServerErrorMiddleware  # noqa: E402

from bench.results import write_result  # noqa: E402
from serve import access_log  # noqa: E402
from serve.auth import ApiKeyGate  # noqa: E402
from serve.deadline import ResponseDeadline  # noqa: E402
from serve.front_door import BodyRoute, FrontDoor, Scope, Send, send_json  # noqa: E402
from serve.request_metrics import RequestMetrics  # noqa: E402

BODY = b"x" * 20_000
SCOPE = {
    "type": "http",
    "method": "POST",
    "path": "/classify",
    "raw_path": b"/classify",
    "query_string": b"",
    "scheme": "http",
    "client": ("127.0.0.1", 50000),
    "headers": [(b"content-type", b"image/jpeg"), (b"content-length", str(len(BODY)).encode())],
}
ANSWER = {"predictions": [{"label": str(i), "index": i, "probability": 0.1} for i in range(5)]}
LAYERS = ("gate", "deadline", "access log", "metrics", "errors")


async def nowhere(scope: Any, receive: Any, send: Any) -> None:
    """The app behind the front door: never reached, since /classify is the front door's own route."""


async def answer(scope: Scope, body: bytes, params: dict[str, list[str]], send: Send) -> None:
    await send_json(send, 200, ANSWER)


def their_metrics() -> Callable[[Any], Any]:
    """BentoML's metrics middleware, every instance sharing one set of Prometheus metrics (a process may
    register each name once)."""
    shared = instruments.RunnerTrafficMetricsMiddleware(nowhere, namespace="bentoml_api_server", skip_paths=["/livez"])
    shared._setup()
    metrics = {k: v for k, v in vars(shared).items() if k.startswith("metrics_") or k == "_is_setup"}

    def layer(app: Any) -> Any:
        middleware = instruments.RunnerTrafficMetricsMiddleware(
            app, namespace="bentoml_api_server", skip_paths=["/livez"]
        )
        vars(middleware).update(metrics)
        return middleware

    return layer


def chains() -> dict[str, dict[str, Any]]:
    """{"bentoml" | "handoff": {"+layer": the app, chain built up to that layer}}."""
    build = {
        "bentoml": {
            "deadline": lambda app: traffic.TimeoutMiddleware(app, timeout=60.0),
            "access log": lambda app: access.AccessLogMiddleware(app, skip_paths=["/livez"]),
            "metrics": their_metrics(),
        },
        "handoff": {
            "deadline": lambda app: ResponseDeadline(app, timeout=60.0),
            "access log": lambda app: access_log.AccessLine(app, skip_paths=("/livez",)),
            "metrics": lambda app: RequestMetrics(app, frozenset({"/classify"})),
        },
    }
    out: dict[str, dict[str, Any]] = {}
    for side, own in build.items():
        app: Any = FrontDoor(nowhere, 10**7, {"/classify": BodyRoute(frozenset({"image/jpeg"}), answer)}, 64, 10.0)
        out[side] = {"front door": app}
        for layer in LAYERS:
            if layer == "gate":
                app = ApiKeyGate(app, keys=(), open_paths=frozenset())
            elif layer == "errors":
                app = ServerErrorMiddleware(app)
            else:
                app = own[layer](app)
            out[side][f"+{layer}"] = app
    return out


async def loop_cpu_per_request(app: Any, requests: int, concurrency: int) -> float:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        pass

    async def client() -> None:
        for _ in range(requests // concurrency):
            await app(dict(SCOPE), receive, send)

    started = time.thread_time()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return (time.thread_time() - started) / requests


def quiet_access_log() -> None:
    """BentoML's line goes to a queue nobody reads (its cost on the loop is making and handing over the
    record); handoff's to its writer thread, which writes nowhere."""
    logger = logging.getLogger("bentoml.access")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.addHandler(QueueHandler(queue.SimpleQueue()))
    access_log._writer = access_log.AccessLogWriter([], [logging.NullHandler()])
    access_log._writer.start()


async def measure(requests: int, concurrency: int, rounds: int) -> dict[str, dict[str, float]]:
    apps = chains()
    for chain in apps.values():
        for app in chain.values():
            await loop_cpu_per_request(app, 400, concurrency)  # warm: code paths taken, series created
    samples: dict[str, dict[str, list[float]]] = {s: {k: [] for k in apps[s]} for s in apps}
    for round_ in range(rounds):
        for layer in apps["bentoml"]:  # the two sides of a layer measured one right after the other
            for side in list(apps)[:: 1 if round_ % 2 == 0 else -1]:
                samples[side][layer].append(await loop_cpu_per_request(apps[side][layer], requests, concurrency))
    return {s: {k: 1e6 * statistics.median(v) for k, v in names.items()} for s, names in samples.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=4000, help="requests per chain per round")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight at once")
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args()
    quiet_access_log()
    figures = uvloop.run(measure(args.requests, args.concurrency, args.rounds))
    print(f"event loop CPU per request, us (median of {args.rounds} rounds): cumulative, and what the layer adds")
    print(f"{'chain up to':<14} {'bentoml':>16} {'handoff':>16}")
    previous = {side: 0.0 for side in figures}
    layers: dict[str, dict[str, float]] = {}
    for name in figures["bentoml"]:
        adds = {side: figures[side][name] - previous[side] for side in figures}
        layers[name] = adds
        row = "".join(f"{figures[side][name]:8.1f} ({adds[side]:+5.1f})" for side in figures)
        print(f"{name:<14} {row}")
        previous = {side: figures[side][name] for side in figures}
    whole = "+errors"
    ratio = figures["bentoml"][whole] / figures["handoff"][whole]
    print(f"the whole chain: bentoml's layers / handoff's: {ratio:.2f} x")
    path = write_result(
        "stack_cost_cpu",
        {
            "rounds": args.rounds,
            "workload": f"a 20 KB raw body to /classify, a stub answer, {args.concurrency} requests at once, uvloop",
            "figures": {
                f"{side}, chain up to {name}, loop CPU per request (median of {args.rounds} rounds)": f"{us:.1f} us"
                for side, names in figures.items()
                for name, us in names.items()
            },
            "layers_us": layers,
            "ratios": {"whole chain, bentoml's layers over handoff's": ratio},
        },
    )
    print(f"wrote {path}")
    sys.stdout.flush()
    os._exit(0)  # BentoML's Prometheus client fails in its finalizer at interpreter shutdown; nothing is left to do


if __name__ == "__main__":
    main()
