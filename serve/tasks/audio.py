"""What the tasks that take audio share: the audio media types, a route that takes an audio file (a multipart form's
`file`, as OpenAI's audio API names it, or the file itself as the body), and the protocol's `audio` input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contract.audio import AUDIO_TYPES, FORMATS
from contract.errors import ClientError
from serve.http.endpoint import ERROR, Endpoint, Handler, plain_error
from serve.model.tensor_inputs import check_rows
from serve.protocols.oip_codec import InferRequest
from serve.protocols.tensors import AUDIO_INPUT
from serve.tasks.base import file_route


def audio_route(
    path: str,
    summary: str,
    handler: Handler,
    answer: tuple[str, dict[str, Any]],
    form_fields: dict[str, str],
    query: tuple[dict[str, Any], ...] = (),
    error_body: Callable[[ClientError], dict[str, Any]] = plain_error,
    error_schema: dict[str, Any] = ERROR,
) -> Endpoint:
    """A model's POST route that takes one audio file: a multipart form (its file field `file`, and `form_fields`'
    others) or the file itself as the body."""
    takes = f"{path} takes an audio file: a multipart/form-data form (field file) or the file itself ({FORMATS})"
    return file_route(path, summary, handler, answer, form_fields, AUDIO_TYPES, takes, query, error_body, error_schema)


def audio_files(request: InferRequest, max_rows: int) -> list[bytes]:
    """The request's `audio`: BYTES [N] or [N, 1] of encoded files, at most `max_rows`."""
    files = request.inputs[AUDIO_INPUT]
    if len(files.shape) not in (1, 2) or files.shape[1:] not in ((), (1,)) or files.datatype != "BYTES":
        raise ClientError(f"input 'audio' must be BYTES of shape [N] or [N, 1], got {list(files.shape)}")
    check_rows(len(files.value), max_rows)
    return list(files.value)
