"""A JPEG body answered as the floors answer it (bench/peer/floor.py, bench/peer/protocol_floor.py): decoded with
the service's preprocessing (the fast decode where the export's check passed), one decoder per core at a time, the
row to the model, and {"index": top-1} as JSON. No checks: the floors trust what the benchmark sends them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import orjson

from contract.manifest import fast_decode_passed, read_manifest_unchecked
from contract.pil_transform import Preprocessor
from serve.model.decode_pool import DecodePool


class JpegAnswer:
    """`await answer(jpeg)` -> the JSON body of the image's top-1 class index."""

    def __init__(
        self, folder: Path, model: Callable[[np.ndarray], Awaitable[np.ndarray]], decoders: DecodePool
    ) -> None:
        manifest = read_manifest_unchecked(folder)
        self.preprocess = Preprocessor.from_manifest(manifest["preprocess"], max_pixels=10**8)
        self.fast = fast_decode_passed(manifest)  # decoding as the service does by default
        self.model, self.decoders = model, decoders

    async def __call__(self, jpeg: bytes) -> bytes:
        row = await self.decoders.run(lambda: self.preprocess(self.preprocess.decode(jpeg, fast=self.fast)))
        logits = await self.model(row[None])
        return orjson.dumps({"index": int(logits[0].argmax())})
