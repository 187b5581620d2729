"""The floor: the least a Python HTTP server costs here. A bare ASGI app (Starlette on uvicorn, one process), the
same decoding (contract/pil_transform.py, one decode per core at a time), the same batcher (serve/model/batching.py) and
the same ONNX Runtime session settings as the service, and nothing else: no BentoML, no middleware, no limits,
no metrics, no access log. Used by bench/serve_throughput.py as the side `peer_floor`.

    python bench/peer/floor.py MODEL_DIR cpu|cuda [--workers N [--shared-model]] PORT

POST /classify takes the JPEG as the body and answers {"index": top-1}; POST /v2/models/{name}/infer the protocol's
binary infer of the preprocessed tensor (bench/peer/oip_tensor.py), answering its logits; GET /readyz answers 200
once loaded.
With N workers (bench/workers.py), each is a uvicorn process with its own event loop and decoders, and either
its own ONNX Runtime session on its share of the cores, or, with --shared-model, none: all send their rows to
one model process (bench/peer/model_process.py) that holds the session and batches across them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.peer.jpeg_answer import JpegAnswer  # noqa: E402
from bench.peer.model_process import ModelClient, SessionModel  # noqa: E402
from bench.peer.oip_tensor import HEADER_LENGTH, answer_of, rows_of  # noqa: E402
from harness.server import ScriptServer  # noqa: E402
from serve.config import usable_cores  # noqa: E402
from serve.model.decode_pool import DecodePool  # noqa: E402


def app(folder: Path, device: str, workers: int = 1, model_socket: str | None = None) -> Starlette:
    """One worker's app; `model_socket`: the model process to send rows to, instead of a session of its own."""
    share = max(1, usable_cores() // workers)  # the service's split of the cores among its workers
    decoders = DecodePool(share)
    if model_socket:
        model: ModelClient | SessionModel = ModelClient(model_socket)
    else:  # one worker: ONNX Runtime's own thread count, as the service's
        model = SessionModel(folder, device, share if workers > 1 else None, decoders)
    jpeg_answer = JpegAnswer(folder, model, decoders)

    async def classify(request: Request) -> Response:
        return Response(await jpeg_answer(await request.body()), media_type="application/json")

    async def infer(request: Request) -> Response:
        body = await request.body()
        logits = await model(rows_of(body, int(request.headers[HEADER_LENGTH])))
        return Response(answer_of(logits), media_type="application/json")

    async def ready(request: Request) -> Response:
        return Response(status_code=200)

    async def provider(request: Request) -> JSONResponse:
        return JSONResponse({"provider": model.provider})

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        if isinstance(model, ModelClient):
            await model.connect()  # on this worker's event loop
        yield

    return Starlette(
        lifespan=lifespan,
        routes=[
            Route("/classify", classify, methods=["POST"]),
            Route("/v2/models/{name}/infer", infer, methods=["POST"]),
            Route("/readyz", ready),
            Route("/provider", provider, methods=["POST"]),
        ],
    )


def app_from_env() -> Starlette:
    """uvicorn's factory for each of several workers (they are started by import string, not by object)."""
    env = os.environ
    return app(Path(env["FLOOR_MODEL_DIR"]), env["FLOOR_DEVICE"], int(env["FLOOR_WORKERS"]), env.get("FLOOR_SOCKET"))


def floor_server(log: Path, folder: Path, device: str, workers: int = 1, shared_model: bool = False) -> ScriptServer:
    """The floor started as a process, with the interface the benchmarks use for BentoML servers."""
    more = ["--workers", str(workers)] + (["--shared-model"] if shared_model else [])
    return ScriptServer(log, Path(__file__), str(folder), device, *more)


@contextlib.contextmanager
def _model_process(folder: Path, device: str) -> Iterator[str]:
    """bench/peer/model_process.py on a Unix socket in a fresh folder: the socket's path once it listens. On the
    way out the process is stopped and the folder (this function's own) removed."""
    socket_folder = Path(tempfile.mkdtemp(prefix="floor-model-"))
    path = str(socket_folder / "model.sock")
    script = Path(__file__).with_name("model_process.py")
    process = subprocess.Popen([sys.executable, str(script), str(folder), device, path])
    try:
        while not os.path.exists(path):
            if process.poll() is not None:
                raise SystemExit(f"the model process exited with {process.returncode} before it listened")
            time.sleep(0.05)
        yield path
    finally:
        process.terminate()
        process.wait(timeout=30)
        shutil.rmtree(socket_folder)


if __name__ == "__main__":
    import uvicorn

    p = argparse.ArgumentParser()
    p.add_argument("folder", type=Path)
    p.add_argument("device", choices=("cpu", "cuda"))
    p.add_argument("port", type=int)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--shared-model", action="store_true")
    args = p.parse_intermixed_args()
    serving = {"host": "127.0.0.1", "port": args.port, "log_level": "warning", "access_log": False}
    if args.workers == 1 and not args.shared_model:
        uvicorn.run(app(args.folder, args.device), **serving)
    else:
        os.environ.update(FLOOR_MODEL_DIR=str(args.folder), FLOOR_DEVICE=args.device, FLOOR_WORKERS=str(args.workers))
        os.environ["PYTHONPATH"] = str(ROOT)  # the workers import this module by name
        with contextlib.ExitStack() as stack:
            if args.shared_model:
                os.environ["FLOOR_SOCKET"] = stack.enter_context(_model_process(args.folder, args.device))
            uvicorn.run("bench.peer.floor:app_from_env", factory=True, workers=args.workers, **serving)
