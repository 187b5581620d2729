"""The protocol's infer for each kind of export, after serve/oip_codec.py has parsed the request:

- an image classifier takes `input` (FP32 rows, already preprocessed) or `image` (BYTES: encoded files,
  decoded and preprocessed as /classify does) and gives `logits` and `probabilities`;
- a text classifier takes `text` (BYTES: UTF-8 texts, tokenized as /classify tokenizes them) and gives the same;
- a detector takes `image` (BYTES, decoded as /detect does) and gives Triton's detection layout (serve/detection.py);
  a segmenter takes the same and gives each image's `classes` (serve/segmentation.py);
- any other model takes and gives what its signature names (serve/tensor_inputs.py checks the request).

Both go through the service's one batcher (`service.batched`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from serve.oip import IMAGE_INPUT, TEXT_INPUT, select_outputs
from serve.oip_codec import InferRequest, OutputTensor, ProtocolError
from serve.tensor_inputs import check_answer_size, check_rows, model_inputs
from serve.text import BadText
from train.pil_transform import BadImage


def _numeric(request: InferRequest, names: list[str]) -> dict[str, np.ndarray]:
    """The values of inputs `names`, refusing a BYTES tensor where the model takes numbers."""
    given = {}
    for name in names:
        tensor = request.inputs[name]
        if tensor.datatype == "BYTES":
            raise ProtocolError(f"input {name!r}: BYTES; this model takes numbers")
        given[name] = tensor.value
    return given


async def classifier_infer(service: Any, request: InferRequest, max_rows: int) -> list[OutputTensor]:
    unknown = sorted(set(request.inputs) - {"input", IMAGE_INPUT})
    if unknown or len(request.inputs) != 1:
        given = f"got {', '.join(sorted(request.inputs))}"
        raise ProtocolError(f"send one input, 'input' (FP32 [N, ...]) or 'image' (BYTES [N]); {given}")
    if IMAGE_INPUT in request.inputs:
        batch = await service.decoders.run(service.prepare_files, _image_files(request, max_rows))
    else:
        # The signature's checks: FP64 and FP16 converted (a value past the model's float range refused), integers
        # refused (a model trained on floats given pixel values 0-255 would answer confidently and wrongly);
        # float32 rows, as decoded images are, so both kinds of request share batches.
        rows = model_inputs(_numeric(request, ["input"]), service.signature, max_rows)["input"]
        batch = rows.astype(np.float32, copy=False)
    outputs = await service.batched(batch)
    return select_outputs(request, {name: outputs[name] for name in ("logits", "probabilities")}, service.classes)


def _image_files(request: InferRequest, max_rows: int) -> list[bytes]:
    """The request's `image`: BYTES [N] or [N, 1] of encoded files, at most `max_rows`."""
    files = request.inputs[IMAGE_INPUT]
    if len(files.shape) not in (1, 2) or files.shape[1:] not in ((), (1,)) or files.datatype != "BYTES":
        raise ProtocolError(f"input 'image' must be BYTES of shape [N] or [N, 1], got {list(files.shape)}")
    check_rows(len(files.value), max_rows)
    return list(files.value)


async def image_task_infer(
    service: Any, request: InferRequest, max_rows: int, max_answer_numbers: int
) -> list[OutputTensor]:
    """A detector's or segmenter's infer: each image queued for the model as soon as it is decoded (so the images
    share batches, and each one's pixels are let go when it has run); a bad image fails the request and cancels
    the others."""
    task = service.detector or service.segmenter
    running: list[asyncio.Future[Any]] = []
    sizes = []
    try:
        if IMAGE_INPUT not in request.inputs or len(request.inputs) != 1:
            given = ", ".join(sorted(request.inputs))
            raise ProtocolError(f"send one input, 'image' (BYTES [N]: encoded images); got {given}")
        for index, data in enumerate(_image_files(request, max_rows)):
            try:
                prepared = await service.decoders.run(task.prepare, data)
            except BadImage as err:
                raise ProtocolError(f"image[{index}]: {err}", status=err.status) from None
            rows, size = prepared  # a segmenter's upload size; a detector's scale back to it
            sizes.append(size)
            if service.segmenter:  # the answer's size is known now: refused before the model runs
                try:
                    service.segmenter.check_answer(sizes, max_answer_numbers)
                except BadImage as err:
                    raise ProtocolError(str(err), status=err.status) from None
            running.append(asyncio.ensure_future(service.batched(rows)))
        answers = list(await asyncio.gather(*running))
    except BaseException:
        for future in running:
            future.cancel()
        raise
    if service.segmenter:  # masks resized and padded in a decoding thread: megabytes, never on the event loop
        outputs = await service.decoders.run(service.segmenter.protocol_outputs, answers, sizes)
        return select_outputs(request, outputs, None)
    return select_outputs(request, service.detector.protocol_outputs(answers, sizes), None)


async def text_infer(service: Any, request: InferRequest, max_rows: int) -> list[OutputTensor]:
    texts = request.inputs.get(TEXT_INPUT)
    if texts is None or len(request.inputs) != 1:
        raise ProtocolError(f"send one input, 'text' (BYTES [N]: UTF-8 texts); got {', '.join(sorted(request.inputs))}")
    if texts.datatype != "BYTES" or len(texts.shape) not in (1, 2) or texts.shape[1:] not in ((), (1,)):
        raise ProtocolError(
            f"input 'text' must be BYTES of shape [N] or [N, 1], got {texts.datatype} {list(texts.shape)}"
        )
    check_rows(len(texts.value), max_rows)
    try:
        encoded = await service.decoders.run(service.text.encode_elements, texts.value)
    except BadText as err:
        raise ProtocolError(str(err), status=err.status) from None
    outputs = await service.batched(encoded.rows)
    return select_outputs(request, {name: outputs[name] for name in ("logits", "probabilities")}, service.text.labels)


async def tensor_infer(
    service: Any, request: InferRequest, max_rows: int, max_answer_numbers: int
) -> list[OutputTensor]:
    given = _numeric(request, list(request.inputs))
    outputs = await service.batched(model_inputs(given, service.signature, max_rows))
    check_answer_size(outputs, max_answer_numbers)
    return select_outputs(request, outputs, None)
