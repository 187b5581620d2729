"""The floor below ASGI: the least a Python front end can cost here once ASGI itself is gone.

An asyncio Protocol on uvloop that parses HTTP/1.1 with httptools (llhttp, the parser uvicorn runs) and answers
the Open Inference Protocol's binary infer of one FP32 tensor, as tritonclient sends it, with the same batcher
and session as the floor (bench/peer/floor.py): no ASGI scope or messages, no Starlette, no middleware, no
limits of any kind; one task per request awaits the batcher (as uvicorn runs each request in a task) and its
callback writes the answer. Not a server to deploy: it trusts every byte it is sent. It is measured beside
NVIDIA Triton (side `peer_protocol_floor`, bench/serve_throughput.py) to learn whether a Python front end
without ASGI could spend as little on a request as Triton's C++ one.

    python bench/peer/protocol_floor.py MODEL_DIR cpu|cuda PORT

POST /v2/models/{name}/infer answers the protocol's JSON response with the logits; POST /classify (the JPEG as the
body) {"index": top-1}; POST /provider the session's ONNX Runtime provider; any other request 200 (the readiness
probe).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import httptools
import orjson
import uvloop

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.peer.jpeg_answer import JpegAnswer  # noqa: E402
from bench.peer.model_process import SessionModel  # noqa: E402
from bench.peer.oip_tensor import HEADER_LENGTH, answer_of, rows_of  # noqa: E402
from serve.config import usable_cores  # noqa: E402
from serve.model.decode_pool import DecodePool  # noqa: E402

HEADER_NAME = HEADER_LENGTH.encode()  # as httptools hands a header's name over


def response(status: bytes, body: bytes, keep_alive: bool) -> bytes:
    connection = b"keep-alive" if keep_alive else b"close"
    head = b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: %s\r\n\r\n"
    return head % (status, len(body), connection) + body


class Connection(asyncio.Protocol):
    """One client connection: a request is parsed as its bytes arrive and answered when the model has."""

    def __init__(self, model: SessionModel, images: JpegAnswer) -> None:
        self.model = model
        self.images = images
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None  # uvloop's own transport class (not a subclass of asyncio.Transport)
        self.url, self.header_length, self.body = b"", 0, bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.write(response(b"400 Bad Request", b'{"error": "bad request"}', False))
            self.transport.close()

    # httptools' callbacks
    def on_message_begin(self) -> None:
        self.url, self.header_length, self.body = b"", 0, bytearray()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == HEADER_NAME:
            self.header_length = int(value)

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        keep_alive = self.parser.should_keep_alive()
        if self.url.endswith(b"/infer"):
            logits = asyncio.ensure_future(self.model(rows_of(self.body, self.header_length)))
            logits.add_done_callback(lambda done: self._answer(answer_of(done.result()), keep_alive))
        elif self.url == b"/classify":
            index = asyncio.ensure_future(self.images(bytes(self.body)))
            index.add_done_callback(lambda done: self._answer(done.result(), keep_alive))
        else:
            about = {"provider": self.model.provider} if self.url == b"/provider" else {}
            self.transport.write(response(b"200 OK", orjson.dumps(about), keep_alive))

    def _answer(self, body: bytes, keep_alive: bool) -> None:
        self.transport.write(response(b"200 OK", body, keep_alive))


async def serve(folder: Path, device: str, port: int) -> None:
    decoders = DecodePool(usable_cores())
    model = SessionModel(folder, device, threads=None, decoders=decoders)
    images = JpegAnswer(folder, model, decoders)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(model, images), "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("folder", type=Path)
    p.add_argument("device", choices=("cpu", "cuda"))
    p.add_argument("port", type=int)
    args = p.parse_args()
    uvloop.run(serve(args.folder, args.device, args.port))
