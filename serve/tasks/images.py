"""What the tasks that take images share: the image media types, the protocol's `image` input, and for the tasks
whose images keep their own sizes (a detector's, a segmenter's) the batch shape and the protocol's infer loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from contract.errors import ClientError
from serve.http.endpoint import Endpoint, Handler
from serve.model.tensor_inputs import check_rows
from serve.protocols.oip_codec import InferRequest
from serve.protocols.tensors import IMAGE_INPUT
from serve.tasks.base import file_route

RAW_IMAGE_TYPES = ("image/jpeg", "image/png", "image/webp", "image/bmp", "image/gif")
IMAGE_FIELDS = {"image": "file"}  # the form of a route that takes an image and nothing else


def image_route(
    path: str,
    summary: str,
    handler: Handler,
    answer: tuple[str, dict[str, Any]],
    form_fields: dict[str, str],
    query: tuple[dict[str, Any], ...] = (),
) -> Endpoint:
    """A model's POST route that takes one image: a multipart form (its file field `image`, and `form_fields`'
    others) or the image itself as the body."""
    takes = (
        f"{path} takes an image: a multipart/form-data form (field image) or the image itself "
        f"({', '.join(RAW_IMAGE_TYPES)})"
    )
    return file_route(path, summary, handler, answer, form_fields, RAW_IMAGE_TYPES, takes, query)


def image_files(request: InferRequest, max_rows: int) -> list[bytes]:
    """The request's `image`: BYTES [N] or [N, 1] of encoded files, at most `max_rows`."""
    files = request.inputs[IMAGE_INPUT]
    if len(files.shape) not in (1, 2) or files.shape[1:] not in ((), (1,)) or files.datatype != "BYTES":
        raise ClientError(f"input 'image' must be BYTES of shape [N] or [N, 1], got {list(files.shape)}")
    check_rows(len(files.value), max_rows)
    return list(files.value)


class OneImageEach:
    """serve/model/batch_shape.py's batch shape for images of their own sizes: any share a batch, each runs alone."""

    def key(self, rows: Any) -> tuple:
        return ()

    def join(self, parts: list[Any]) -> Any:
        (only,) = parts
        return only

    def fits(self, parts: list[Any], more: Any) -> bool:
        return True

    def groups(self, parts: list[Any]) -> list[list[int]]:
        return [[i] for i in range(len(parts))]


async def each_image(
    request: InferRequest,
    max_rows: int,
    prepare: Callable[[bytes], Awaitable[tuple[Any, Any]]],
    batched: Callable[[Any], Awaitable[dict[str, np.ndarray]]],
    check: Callable[[list[Any]], None] = lambda sizes: None,
) -> tuple[list[dict[str, np.ndarray]], list[Any]]:
    """The protocol's images, each queued for the model as soon as it is decoded (so they share batches, and each
    one's pixels are let go when it has run): each one's outputs and what `prepare` said of its size. `check` sees
    the sizes so far before each image runs. A bad image fails the request and cancels the others."""
    running: list[asyncio.Future[Any]] = []
    sizes = []
    try:
        if IMAGE_INPUT not in request.inputs or len(request.inputs) != 1:
            given = ", ".join(sorted(request.inputs))
            raise ClientError(f"send one input, 'image' (BYTES [N]: encoded images); got {given}")
        for index, data in enumerate(image_files(request, max_rows)):
            try:
                rows, size = await prepare(data)
            except ClientError as err:
                raise ClientError(f"image[{index}]: {err}", err.status) from None
            sizes.append(size)
            check(sizes)
            running.append(asyncio.ensure_future(batched(rows)))
        return list(await asyncio.gather(*running)), sizes
    except BaseException:
        for future in running:
            future.cancel()
        raise
