"""The floor: the least a Python HTTP server costs here. A bare ASGI app (Starlette on uvicorn, one process), the
same decoding (train/pil_transform.py, one decode per core at a time), the same batcher (serve/batching.py) and
the same ONNX Runtime session settings as the service, and nothing else: no BentoML, no middleware, no limits,
no metrics, no access log. Used by bench/serve_throughput.py as the side `peer_floor`.

    python bench/peer/floor.py MODEL_DIR cpu|cuda PORT

POST /classify takes the JPEG as the body and answers {"index": top-1}; GET /readyz answers 200 once loaded.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from export.manifest import fast_decode_passed, read_manifest_unchecked  # noqa: E402
from harness.server import ScriptServer  # noqa: E402
from serve.batching import ModelBatcher  # noqa: E402
from serve.config import usable_cores  # noqa: E402
from serve.decode_pool import DecodePool  # noqa: E402
from serve.runtime import onnx_providers, onnx_session_options  # noqa: E402
from train.pil_transform import Preprocessor  # noqa: E402


def app(folder: Path, device: str) -> Starlette:
    import onnxruntime as ort

    session = ort.InferenceSession(str(folder / "model.onnx"), onnx_session_options(), providers=onnx_providers(device))
    manifest = read_manifest_unchecked(folder)
    pre = Preprocessor.from_manifest(manifest["preprocess"], max_pixels=10**8)
    fast = fast_decode_passed(manifest)  # decoding as the service does by default
    decoders = DecodePool(usable_cores())
    state: dict[str, ModelBatcher] = {}

    def run(batch: np.ndarray) -> np.ndarray:
        return session.run(None, {"input": batch})[0]

    async def classify(request: Request) -> JSONResponse:
        body = await request.body()
        row = await decoders.run(lambda: pre(pre.decode(body, fast=fast)))
        if "batcher" not in state:  # on the server's loop, at the first request
            state["batcher"] = ModelBatcher(run, 32, 10_000, upstream=decoders)
        logits = await state["batcher"](row[None])
        return JSONResponse({"index": int(logits[0].argmax())})

    async def ready(request: Request) -> Response:
        return Response(status_code=200)

    async def provider(request: Request) -> JSONResponse:
        return JSONResponse({"provider": session.get_providers()[0]})

    return Starlette(
        routes=[
            Route("/classify", classify, methods=["POST"]),
            Route("/readyz", ready),
            Route("/provider", provider, methods=["POST"]),
        ]
    )


def floor_server(log: Path, folder: Path, device: str) -> ScriptServer:
    """The floor started as a process, with the interface the benchmarks use for BentoML servers."""
    return ScriptServer(log, Path(__file__), str(folder), device)


if __name__ == "__main__":
    import uvicorn

    folder, device, port = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    uvicorn.run(app(folder, device), host="127.0.0.1", port=port, log_level="warning", access_log=False)
