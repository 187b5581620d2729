"""One model process fed by several HTTP workers: the other way to put N event loops in front of one device
(issue 33, item 4), built to measure it against N workers that each hold their own session.

The model process holds the one ONNX Runtime session and the batcher (serve/model/batching.py) and listens on a Unix
socket; each HTTP worker decodes its images, sends the rows there and awaits the logits. A frame each way:

    request:  id (u64), the rows' shape N, C, H, W (4 x u32), then N*C*H*W float32
    response: id (u64), byte count (u32), then the logits as float32; FAILED as the count: no logits (the
              batcher refused or the model raised), and the worker's request fails

A frame whose shape is not the model's (C, H, W) or holds more than MAX_ROWS rows closes its connection before
any of its data is read.

Each worker keeps one connection and many requests in flight on it, answered by id in any order. The batcher
here cannot see the workers' decoders (they are in other processes), so it never holds a batch for rows still
being decoded, as the service's can.

    python bench/peer/model_process.py MODEL_DIR cpu|cuda SOCKET
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from serve.model.batching import ModelBatcher  # noqa: E402
from serve.model.decode_pool import DecodePool  # noqa: E402
from serve.model.runtime import onnx_providers, onnx_session_options  # noqa: E402

REQUEST = struct.Struct("<Q4I")
RESPONSE = struct.Struct("<QI")
FAILED = 0xFFFFFFFF
MAX_ROWS = 32  # a worker sends one request's rows: one image each


class SessionModel:
    """An ONNX Runtime session behind the service's batcher: the model process's, or a floor worker's own.
    `decoders`: where the rows are decoded, when in this process (the batcher may then hold for them)."""

    def __init__(self, folder: Path, device: str, threads: int | None, decoders: DecodePool | None = None) -> None:
        import onnxruntime as ort

        options = onnx_session_options(threads)
        self.session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=onnx_providers(device))
        self.decoders = decoders
        self.batcher: ModelBatcher | None = None
        self.provider = self.session.get_providers()[0]
        self.row_shape = tuple(self.session.get_inputs()[0].shape[1:])  # (C, H, W): fixed for an image classifier

    async def __call__(self, rows: np.ndarray) -> np.ndarray:
        if self.batcher is None:  # on the server's loop, at the first request
            self.batcher = ModelBatcher(self._run, 32, 10_000, upstream=self.decoders)
        return await self.batcher(rows)

    def _run(self, batch: np.ndarray) -> np.ndarray:
        return self.session.run(None, {"input": batch})[0]


async def serve_model(folder: Path, device: str, path: str) -> None:
    """Answer rows sent to the Unix socket `path` with the model's logits, batching across every connection."""
    model = SessionModel(folder, device, threads=None)
    answering: set[asyncio.Task[None]] = set()  # the loop keeps only weak references to tasks

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def answer(request_id: int, rows: np.ndarray) -> None:
            try:
                logits = np.ascontiguousarray(await model(rows), dtype=np.float32).tobytes()
            except Exception:  # noqa: BLE001 - whatever failed, the worker's request fails instead of waiting
                writer.write(RESPONSE.pack(request_id, FAILED))
                return
            writer.write(RESPONSE.pack(request_id, len(logits)) + logits)

        while True:
            try:
                request_id, rows, *row_shape = REQUEST.unpack(await reader.readexactly(REQUEST.size))
                if not 1 <= rows <= MAX_ROWS or tuple(row_shape) != model.row_shape:
                    writer.close()  # checked before reading what the frame claims to carry
                    return
                data = await reader.readexactly(4 * rows * int(np.prod(row_shape)))
            except asyncio.IncompleteReadError:  # the worker went away
                return
            shape = (rows, *row_shape)
            task = asyncio.create_task(answer(request_id, np.frombuffer(data, np.float32).reshape(shape)))
            answering.add(task)
            task.add_done_callback(answering.discard)

    server = await asyncio.start_unix_server(connection, path)
    async with server:
        await server.serve_forever()


class ModelClient:
    """In an HTTP worker: `await client(rows)` -> the model process's logits for those rows."""

    provider = "model process"

    def __init__(self, path: str) -> None:
        self.path = path
        self.ids = itertools.count()
        self.waiting: dict[int, asyncio.Future[np.ndarray]] = {}
        self.writer: asyncio.StreamWriter | None = None
        self.reading: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        """On the worker's own event loop, before its first request."""
        reader, self.writer = await asyncio.open_unix_connection(self.path)
        self.reading = asyncio.create_task(self._read(reader))

    async def __call__(self, rows: np.ndarray) -> np.ndarray:
        assert self.writer is not None and self.reading is not None, "connect() first"
        if self.reading.done():
            raise ConnectionError("the model process closed its socket")
        request_id = next(self.ids)
        answer = self.waiting[request_id] = asyncio.get_running_loop().create_future()
        self.writer.write(REQUEST.pack(request_id, *rows.shape) + np.ascontiguousarray(rows, np.float32).tobytes())
        return (await answer).reshape(len(rows), -1)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                request_id, size = RESPONSE.unpack(await reader.readexactly(RESPONSE.size))
                if size == FAILED:
                    self.waiting.pop(request_id).set_exception(RuntimeError("the model process failed these rows"))
                    continue
                logits = np.frombuffer(await reader.readexactly(size), np.float32)
                self.waiting.pop(request_id).set_result(logits)
        except (asyncio.IncompleteReadError, OSError):  # the model process is gone (closed, or reset)
            # Fail what waits: a request left waiting would also hold up this worker's shutdown.
            for answer in self.waiting.values():
                answer.set_exception(ConnectionError("the model process closed its socket"))
            self.waiting.clear()


if __name__ == "__main__":
    import uvloop

    uvloop.run(serve_model(Path(sys.argv[1]), sys.argv[2], sys.argv[3]))
