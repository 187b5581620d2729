"""The Open Inference Protocol's REST endpoints (KServe V2, with Triton's extensions), beside handoff's own.

    GET  /v2                                       server metadata: name, version, the extensions implemented
    GET  /v2/health/live, /v2/health/ready         200 {"live": true} / {"ready": true}; 503 {"error": ...}
    GET  /v2/models/NAME[/versions/1]              model metadata: inputs and outputs (datatype, shape)
    GET  /v2/models/NAME[/versions/1]/ready        200 or 503, as health/ready
    GET  /v2/models/NAME[/versions/1]/config       Triton's model configuration (max_batch_size, TYPE_*, dims)
    POST /v2/models/NAME[/versions/1]/infer        JSON, or JSON + binary tensors (serve/oip_codec.py)

NAME is HANDOFF_MODEL_NAME; the only version is "1" (an export folder is one version); anything else is 404.
Every error is {"error": "..."}, the one form tritonclient decodes. Infer requests go through the front door
(its limits, its one batcher, no second session), and the manifest's signature says what they may hold.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from contract.errors import ClientError
from serve.endpoint import Answer, Incoming
from serve.oip_codec import (
    InferRequest,
    OutputTensor,
    RequestedOutput,
    classification_strings,
    encode_infer_response,
    parse_infer_request,
    protocol_datatype,
)

if TYPE_CHECKING:
    from serve.service import ModelService

VERSION = "1"
# Exactly what is implemented: no `statistics` (no /v2/models/NAME/stats), no shared memory, no repository API.
EXTENSIONS = ["binary_tensor_data", "classification", "model_configuration"]
IMAGE_INPUT = "image"  # an image task's encoded image files, decoded as its own route decodes them
TEXT_INPUT = "text"  # a text task's UTF-8 texts, tokenized as its own route tokenizes them
TEXT_PAIR_INPUT = "text_pair"  # a pair model's second texts, one per row of `text`
# A request body up to this size is parsed on the event loop (tens of microseconds; a thread hop costs more, and
# the image path already takes one to decode); a larger one (tensors as text, ~50 ms for 3 MB) goes to a thread.
INLINE_JSON_BYTES = 64 * 1024


@dataclass(frozen=True)
class ServedTensor:
    """A tensor as the protocol names it: its datatype (FP32, BYTES...) and shape (-1: any size)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    def config(self) -> dict[str, Any]:
        """Triton's config entry: the dims after the batch, and TYPE_STRING for BYTES."""
        kind = "STRING" if self.datatype == "BYTES" else self.datatype
        entry: dict[str, Any] = {"name": self.name, "data_type": f"TYPE_{kind}", "dims": list(self.shape[1:])}
        if self.optional:
            entry["optional"] = True
        return entry


def model_paths(name: str) -> list[str]:
    """/v2/models/NAME and its versioned twin: the prefixes of every model endpoint."""
    return [f"/v2/models/{name}", f"/v2/models/{name}/versions/{VERSION}"]


class ProtocolSurface:
    """The protocol's endpoints for one served model; `service()` is the running service, which gives the
    readiness, the task (its tensors and its infer), the runtime and the settings."""

    def __init__(self, model_name: str, server_version: str, service: Callable[[], ModelService]) -> None:
        self.name = model_name
        self.version = server_version
        self.service = service

    def for_this_model(
        self, handler: Callable[[Incoming], Awaitable[Answer]]
    ) -> Callable[[Incoming], Awaitable[Answer]]:
        async def checked(request: Incoming) -> Answer:
            name, version = request.path_params["name"], request.path_params.get("version", VERSION)
            if name != self.name or version != VERSION:
                raise ClientError(f"unknown model {name!r} version {version!r}; this server serves {self.name!r}", 404)
            return await handler(request)

        return checked

    async def not_found(self, request: Incoming) -> Answer:
        raise ClientError(f"no protocol endpoint {request.scope['method']} {request.scope['path'][:200]}", 404)

    async def server_metadata(self, request: Incoming) -> Answer:
        return Answer({"name": "handoff", "version": self.version, "extensions": EXTENSIONS})

    async def live(self, request: Incoming) -> Answer:
        return Answer({"live": True})

    async def ready(self, request: Incoming) -> Answer:
        reason = self.service().unready
        if reason is not None:
            raise ClientError(f"model not ready: {reason}", 503)
        return Answer({"ready": True})

    async def model_metadata(self, request: Incoming) -> Answer:
        service = self.service().require_ready()
        inputs, outputs = service.task.protocol_tensors()
        return Answer(
            {
                "name": self.name,
                "versions": [VERSION],
                "platform": service.platform(),
                "inputs": [t.metadata() for t in inputs],
                "outputs": [t.metadata() for t in outputs],
            }
        )

    async def model_config(self, request: Incoming) -> Answer:
        service = self.service().require_ready()
        inputs, outputs = service.task.protocol_tensors()
        return Answer(
            {
                "name": self.name,
                "platform": service.platform(),
                "backend": service.runtime.name,
                "max_batch_size": service.config.max_batch_size,
                "input": [t.config() for t in inputs],
                "output": [t.config() for t in outputs],
                # handoff batches every request with whatever queued meanwhile; it never waits on purpose
                "dynamic_batching": {"max_queue_delay_microseconds": 0},
                "instance_group": [
                    {"count": 1, "kind": "KIND_GPU" if service.runtime.device == "cuda" else "KIND_CPU"}
                ],
            }
        )

    async def infer(self, request: Incoming) -> Answer:
        if request.params:
            raise ClientError(f"unknown query parameter(s) {', '.join(sorted(request.params))}")
        service = self.service().require_room()
        max_rows = service.config.max_batch_size
        header = dict(request.scope.get("headers") or []).get(b"inference-header-content-length")
        # A small request is parsed on the event loop, a large one (tensors as text, many BYTES elements) in a
        # decoder thread; the whole body decides, binary part included: splitting a BYTES tensor costs time too.
        small_request = len(request.body) <= INLINE_JSON_BYTES
        parsed = await service.decoders.run(parse_infer_request, request.body, header, max_rows, inline=small_request)
        outputs = await service.task.infer(parsed)
        small_answer = sum(output.value.nbytes for output in outputs) <= INLINE_JSON_BYTES  # any model's: megabytes
        body, headers = await service.decoders.run(
            encode_infer_response, self.name, VERSION, parsed.id, outputs, inline=small_answer
        )
        return Answer(body, None, headers=tuple(headers))

    def describe(self) -> dict[str, Any]:
        """Where the protocol's endpoints are, for /info and the page."""
        prefix = model_paths(self.name)[0]
        return {
            "name": "Open Inference Protocol (KServe V2 / Triton HTTP)",
            "model_name": self.name,
            "metadata": prefix,
            "infer": f"{prefix}/infer",
            "config": f"{prefix}/config",
            "health": ["/v2/health/live", "/v2/health/ready"],
        }


def select_outputs(
    request: InferRequest, available: dict[str, np.ndarray], labels: list[str] | None
) -> list[OutputTensor]:
    """The outputs the request asked for (all of them by default), each as binary or JSON as asked, and
    with `classification: k` as Triton's top-k strings."""
    wanted = request.outputs or _every_output(tuple(available))
    outputs = []
    for asked in wanted:
        if asked.name not in available:
            raise ClientError(f"unknown output {asked.name!r}; this model gives {', '.join(available)}")
        binary = request.binary_output if asked.binary is None else asked.binary
        value = available[asked.name]
        if asked.classification is not None:
            if value.ndim != 2 or not np.issubdtype(value.dtype, np.floating):
                raise ClientError(f"output {asked.name!r}: classification needs scores of shape [N, classes]")
            outputs.append(
                OutputTensor(asked.name, "BYTES", classification_strings(value, asked.classification, labels), binary)
            )
        else:
            outputs.append(OutputTensor(asked.name, protocol_datatype(value.dtype), value, binary))
    return outputs


@functools.cache
def _every_output(names: tuple[str, ...]) -> tuple[RequestedOutput, ...]:
    """What a request that names no outputs asks for: each of the model's (made once per set of names)."""
    return tuple(RequestedOutput(name, None, None) for name in names)
