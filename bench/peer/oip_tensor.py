"""The Open Inference Protocol's binary infer of one FP32 tensor, as the floors read and answer it: the rows from a
body (its JSON header, then the tensor's bytes) and the JSON response with the logits. No checks: the floors trust
what the benchmark sends them."""

from __future__ import annotations

import numpy as np
import orjson

HEADER_LENGTH = "inference-header-content-length"


def rows_of(body: bytes | bytearray, header_length: int) -> np.ndarray:
    """The tensor a binary infer carries, shaped as its JSON header says."""
    header = orjson.loads(body[:header_length])
    return np.frombuffer(body, np.float32, offset=header_length).reshape(header["inputs"][0]["shape"])


def answer_of(logits: np.ndarray) -> bytes:
    """The protocol's JSON response with `logits` as its one output."""
    output = {"name": "logits", "datatype": "FP32", "shape": list(logits.shape), "data": logits.ravel().tolist()}
    return orjson.dumps({"model_name": "handoff", "outputs": [output]})
