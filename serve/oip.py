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

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from bentoml.exceptions import BentoMLException
from starlette.requests import Request
from starlette.responses import JSONResponse

from export.signature import (
    TASK_IMAGE_CLASSIFICATION,
    TASK_OBJECT_DETECTION,
    TASK_SEMANTIC_SEGMENTATION,
    TASK_TEXT_CLASSIFICATION,
    Signature,
)
from serve.front_door import Scope, Send
from serve.handlers import send_client_error
from serve.oip_codec import (
    OIP_DATATYPE,
    InferRequest,
    OutputTensor,
    ProtocolError,
    RequestedOutput,
    classification_strings,
    encode_infer_response,
    parse_infer_request,
)

VERSION = "1"
# Exactly what is implemented: no `statistics` (no /v2/models/NAME/stats), no shared memory, no repository API.
EXTENSIONS = ["binary_tensor_data", "classification", "model_configuration"]
IMAGE_INPUT = "image"  # a classifier's encoded image files, decoded as /classify decodes them
TEXT_INPUT = "text"  # a text classifier's UTF-8 texts, tokenized as /classify tokenizes them
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


def served_tensors(task: str, signature: Signature) -> tuple[list[ServedTensor], list[ServedTensor]]:
    """What the protocol takes and gives. An image classifier takes its preprocessed `input`, or `image` (encoded
    files), one of the two; a text classifier takes `text`; both give `probabilities` beside the `logits`."""
    inputs = [ServedTensor(t.name, OIP_DATATYPE[t.dtype], t.shape) for t in signature.inputs]
    outputs = [ServedTensor(t.name, OIP_DATATYPE[t.dtype], t.shape) for t in signature.outputs]
    if task == TASK_IMAGE_CLASSIFICATION:
        (model_input,) = inputs
        inputs = [
            ServedTensor(model_input.name, model_input.datatype, model_input.shape, optional=True),
            ServedTensor(IMAGE_INPUT, "BYTES", (-1, 1), optional=True),
        ]
        outputs = [*outputs, ServedTensor("probabilities", "FP32", outputs[0].shape)]
    elif task == TASK_TEXT_CLASSIFICATION:  # texts in (tokenized by the service), the logits' softmax beside them
        inputs = [ServedTensor(TEXT_INPUT, "BYTES", (-1,))]
        outputs = [*outputs, ServedTensor("probabilities", "FP32", outputs[0].shape)]
    elif task == TASK_OBJECT_DETECTION:  # encoded images in, Triton's detection layout out (serve/detection.py)
        inputs = [ServedTensor(IMAGE_INPUT, "BYTES", (-1, 1))]
        outputs = [
            ServedTensor("num_detections", "INT32", (-1,)),
            ServedTensor("detection_boxes", "FP32", (-1, -1, 4)),
            ServedTensor("detection_scores", "FP32", (-1, -1)),
            ServedTensor("detection_classes", "INT64", (-1, -1)),
        ]
    elif task == TASK_SEMANTIC_SEGMENTATION:  # encoded images in, each pixel's class out (serve/segmentation.py)
        inputs = [ServedTensor(IMAGE_INPUT, "BYTES", (-1, 1))]
        outputs = [ServedTensor("classes", "INT32", (-1, -1, -1))]
    return inputs, outputs


def model_paths(name: str) -> list[str]:
    """/v2/models/NAME and its versioned twin: the prefixes of every model endpoint."""
    return [f"/v2/models/{name}", f"/v2/models/{name}/versions/{VERSION}"]


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


class ProtocolSurface:
    """The protocol's endpoints for one served model; `service()` is the BentoML service instance, which
    gives the readiness, the tensors, the settings and `protocol_infer`."""

    def __init__(self, model_name: str, server_version: str, service: Callable[[], Any]) -> None:
        self.name = model_name
        self.version = server_version
        self.service = service

    def for_this_model(self, handler: Callable[[Request], Awaitable[JSONResponse]]) -> Callable[..., Any]:
        async def checked(request: Request) -> JSONResponse:
            name, version = request.path_params["name"], request.path_params.get("version", VERSION)
            if name != self.name or version != VERSION:
                return error(404, f"unknown model {name!r} version {version!r}; this server serves {self.name!r}")
            return await handler(request)

        return checked

    async def not_found(self, request: Request) -> JSONResponse:
        return error(404, f"no protocol endpoint {request.method} {request.url.path[:200]}")

    async def server_metadata(self, request: Request) -> JSONResponse:
        return JSONResponse({"name": "handoff", "version": self.version, "extensions": EXTENSIONS})

    async def live(self, request: Request) -> JSONResponse:
        return JSONResponse({"live": True})

    async def ready(self, request: Request) -> JSONResponse:
        reason = self.service().unready
        return JSONResponse({"ready": True}) if reason is None else error(503, f"model not ready: {reason}")

    def _tensors(self) -> tuple[list[ServedTensor], list[ServedTensor]] | JSONResponse:
        service = self.service()
        if service.not_ready is not None:
            return error(503, f"model not ready: {service.not_ready}")
        return served_tensors(service.task, service.signature)

    async def model_metadata(self, request: Request) -> JSONResponse:
        tensors = self._tensors()
        if isinstance(tensors, JSONResponse):
            return tensors
        inputs, outputs = tensors
        return JSONResponse(
            {
                "name": self.name,
                "versions": [VERSION],
                "platform": self.service().platform(),
                "inputs": [t.metadata() for t in inputs],
                "outputs": [t.metadata() for t in outputs],
            }
        )

    async def model_config(self, request: Request) -> JSONResponse:
        tensors = self._tensors()
        if isinstance(tensors, JSONResponse):
            return tensors
        inputs, outputs = tensors
        service = self.service()
        return JSONResponse(
            {
                "name": self.name,
                "platform": service.platform(),
                "backend": service.runtime.name,
                "max_batch_size": service.max_batch_size(),
                "input": [t.config() for t in inputs],
                "output": [t.config() for t in outputs],
                # handoff batches every request with whatever queued meanwhile; it never waits on purpose
                "dynamic_batching": {"max_queue_delay_microseconds": 0},
                "instance_group": [
                    {"count": 1, "kind": "KIND_GPU" if service.runtime.device == "cuda" else "KIND_CPU"}
                ],
            }
        )

    async def infer(self, scope: Scope, body: bytes, params: dict[str, list[str]], send: Send) -> None:
        service = self.service()
        try:
            if params:
                raise ProtocolError(f"unknown query parameter(s) {', '.join(sorted(params))}")
            if service.not_ready is not None:
                raise ProtocolError(f"model not ready: {service.not_ready}", status=503)
            header = dict(scope.get("headers") or []).get(b"inference-header-content-length")
            # The whole body decides, binary part included: splitting a BYTES tensor costs time too.
            if len(body) <= INLINE_JSON_BYTES:  # a small request: parsed here, no thread hop
                request = parse_infer_request(body, header, service.max_batch_size())
            else:  # a large one (tensors as text, many BYTES elements) is parsed off the event loop
                request = await service.decoders.run(parse_infer_request, body, header, service.max_batch_size())
            outputs = await service.protocol_infer(request)
        except ProtocolError as err:
            return await send_client_error(scope, send, err.status, err)
        except BentoMLException as err:  # the service's own 4xx (a bad image), or 503 when overloaded
            return await send_client_error(scope, send, err.error_code.value, err)
        if sum(output.value.nbytes for output in outputs) <= INLINE_JSON_BYTES:
            body_out, headers = encode_infer_response(self.name, VERSION, request.id, outputs)
        else:  # a large answer (any model's, megabytes) is encoded off the event loop
            body_out, headers = await service.decoders.run(
                encode_infer_response, self.name, VERSION, request.id, outputs
            )
        headers.append((b"content-length", str(len(body_out)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body_out})

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
    wanted = request.outputs or tuple(RequestedOutput(name, None, None) for name in available)
    outputs = []
    for asked in wanted:
        if asked.name not in available:
            raise ProtocolError(f"unknown output {asked.name!r}; this model gives {', '.join(available)}")
        binary = request.binary_output if asked.binary is None else asked.binary
        value = available[asked.name]
        if asked.classification is not None:
            if value.ndim != 2 or not np.issubdtype(value.dtype, np.floating):
                raise ProtocolError(f"output {asked.name!r}: classification needs scores of shape [N, classes]")
            outputs.append(
                OutputTensor(asked.name, "BYTES", classification_strings(value, asked.classification, labels), binary)
            )
        else:
            outputs.append(OutputTensor(asked.name, OIP_DATATYPE[value.dtype.name], value, binary))
    return outputs
