"""The Open Inference Protocol's REST endpoints (KServe V2, with Triton's extensions), beside handoff's own.

    GET  /v2                                       server metadata: name, version, the extensions implemented
    GET  /v2/health/live, /v2/health/ready         200 {"live": true} / {"ready": true}; 503 {"error": ...}
    GET  /v2/models/NAME[/versions/1]              model metadata: inputs and outputs (datatype, shape)
    GET  /v2/models/NAME[/versions/1]/ready        200 or 503, as health/ready
    GET  /v2/models/NAME[/versions/1]/config       Triton's model configuration (max_batch_size, TYPE_*, dims)
    POST /v2/models/NAME[/versions/1]/infer        JSON, or JSON + binary tensors (serve/protocols/oip_codec.py)

NAME is HANDOFF_MODEL_NAME; the only version is "1" (an export folder is one version); anything else is 404.
Every error is {"error": "..."}, the one form tritonclient decodes. Infer requests go through the front door
(its limits, its one batcher, no second session), and the manifest's signature says what they may hold.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from contract.errors import ClientError
from serve.config import ServeConfig
from serve.http.endpoint import Answer, Incoming
from serve.model.decode_pool import DecodePool
from serve.model.runtime import Runtime
from serve.protocols.oip_codec import InferRequest, OutputTensor, encode_infer_response, parse_infer_request
from serve.protocols.tensors import ServedTensor

VERSION = "1"
# Exactly what is implemented: no `statistics` (no /v2/models/NAME/stats), no shared memory, no repository API.
EXTENSIONS = ["binary_tensor_data", "classification", "model_configuration"]
# A request body up to this size is parsed on the event loop (tens of microseconds; a thread hop costs more, and
# the image path already takes one to decode); a larger one (tensors as text, ~50 ms for 3 MB) goes to a thread.
INLINE_JSON_BYTES = 64 * 1024


def model_paths(name: str) -> list[str]:
    """/v2/models/NAME and its versioned twin: the prefixes of every model endpoint."""
    return [f"/v2/models/{name}", f"/v2/models/{name}/versions/{VERSION}"]


class InferringTask(Protocol):
    """What the protocol asks of the served task (serve/tasks/base.py's `ProtocolTask` gives it)."""

    def protocol_tensors(self) -> tuple[list[ServedTensor], list[ServedTensor]]: ...

    async def infer(self, request: InferRequest) -> list[OutputTensor]: ...


class ServedModel(Protocol):
    """What the protocol's endpoints use of the running service (serve/service.py's ModelService)."""

    @property
    def unready(self) -> str | None: ...

    @property
    def config(self) -> ServeConfig: ...

    @property
    def runtime(self) -> Runtime: ...

    @property
    def decoders(self) -> DecodePool: ...

    def require_ready(self) -> ServedModel: ...

    def require_room(self) -> ServedModel: ...

    def platform(self) -> str: ...

    def protocol_task(self) -> InferringTask:
        """The task, where it answers the protocol's infer; ClientError where it does not."""
        ...


class ProtocolSurface:
    """The protocol's endpoints for one served model; `service()` is the running service, which gives the
    readiness, the task (its tensors and its infer), the runtime and the settings."""

    def __init__(self, model_name: str, server_version: str, service: Callable[[], ServedModel]) -> None:
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
        inputs, outputs = service.protocol_task().protocol_tensors()
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
        inputs, outputs = service.protocol_task().protocol_tensors()
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
        task = service.protocol_task()
        max_rows = service.config.max_batch_size
        header = dict(request.scope.get("headers") or []).get(b"inference-header-content-length")
        # A small request is parsed on the event loop, a large one (tensors as text, many BYTES elements) in a
        # decoder thread; the whole body decides, binary part included: splitting a BYTES tensor costs time too.
        small_request = len(request.body) <= INLINE_JSON_BYTES
        parsed = await service.decoders.run(parse_infer_request, request.body, header, max_rows, inline=small_request)
        outputs = await task.infer(parsed)
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
