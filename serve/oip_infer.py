"""The protocol's infer for each kind of export, after serve/oip_codec.py has parsed the request:

- an image classifier takes `input` (FP32 rows, already preprocessed) or `image` (BYTES: encoded files,
  decoded and preprocessed as /classify does) and gives `logits` and `probabilities`;
- any other model takes and gives what its signature names (serve/tensor_inputs.py checks the request).

Both go through the service's one batcher (`service.batched`).
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np

from serve.oip import IMAGE_INPUT, select_outputs
from serve.oip_codec import InferRequest, InputTensor, OutputTensor, ProtocolError
from serve.runtime import softmax
from serve.tensor_inputs import model_inputs


def _check_rows(rows: int, max_rows: int) -> None:
    if not 1 <= rows <= max_rows:
        raise ProtocolError(f"{rows} rows; send 1 to {max_rows} per request (HANDOFF_MAX_BATCH_SIZE)")


def _classifier_rows(tensor: InputTensor, input_shape: tuple[int, ...], max_rows: int) -> np.ndarray:
    # FP64 and FP16 are converted (FP32 holds every FP16 value; FP64 is rounded as NumPy rounds); integers
    # are refused: a model trained on floats given pixel values 0-255 would answer confidently and wrongly.
    if tensor.datatype not in ("FP32", "FP64", "FP16"):
        raise ProtocolError(f"input 'input' is FP32 (FP64 and FP16 are converted), not {tensor.datatype}")
    if tensor.shape[1:] != input_shape or len(tensor.shape) != 1 + len(input_shape):
        expected = ", ".join(map(str, input_shape))
        raise ProtocolError(f"input 'input' has shape {list(tensor.shape)}; expected [N, {expected}]")
    _check_rows(tensor.shape[0], max_rows)
    batch = np.asarray(tensor.value, dtype=np.float32)
    if not np.isfinite(batch).all():  # an FP64 value past float32's range became Inf
        raise ProtocolError("input 'input' holds values beyond float32's range")
    return batch


async def classifier_infer(service: Any, request: InferRequest, max_rows: int) -> list[OutputTensor]:
    unknown = sorted(set(request.inputs) - {"input", IMAGE_INPUT})
    if unknown or len(request.inputs) != 1:
        given = f"got {', '.join(sorted(request.inputs))}"
        raise ProtocolError(f"send one input, 'input' (FP32 [N, ...]) or 'image' (BYTES [N]); {given}")
    if IMAGE_INPUT in request.inputs:
        files = request.inputs[IMAGE_INPUT]
        if len(files.shape) not in (1, 2) or files.shape[1:] not in ((), (1,)) or files.datatype != "BYTES":
            raise ProtocolError(f"input 'image' must be BYTES of shape [N] or [N, 1], got {list(files.shape)}")
        _check_rows(len(files.value), max_rows)
        batch = await anyio.to_thread.run_sync(service.prepare_files, files.value, limiter=service.decoders)
    else:
        batch = _classifier_rows(request.inputs["input"], service.input_shape, max_rows)
    logits = await service.batched(batch)
    return select_outputs(request, {"logits": logits, "probabilities": softmax(logits)}, service.classes)


async def tensor_infer(service: Any, request: InferRequest, max_rows: int) -> list[OutputTensor]:
    given = {}
    for name, tensor in request.inputs.items():
        if tensor.datatype == "BYTES":
            raise ProtocolError(f"input {name!r}: BYTES; this model takes numbers")
        given[name] = tensor.value
    outputs = await service.batched(model_inputs(given, service.signature, max_rows))
    return select_outputs(request, outputs, None)
