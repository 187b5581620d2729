"""What every served task implements, and what it is given.

A task turns requests into the model's rows and the model's outputs into answers, in the spirit of LitServe's
decode/predict/encode and KServe's preprocess/predict/postprocess, shaped to what handoff has:

    request --decode (a decoding thread)--> rows --the batcher (the model thread: `run`)--> outputs --> answer

- `endpoints`: its own routes (required): each row's path, media types, form fields, body limit, request and
  answer schemas and its handler, a method of the task that the router calls directly (serve/http/router.py); the
  service adds them to the routes every model has (serve/http/routes.py), so /docs.json lists this model's alone;
- `run`: the model's call on a batch of rows, in the model thread (whatever is cheaper there than on the
  event loop, a softmax or a ranking, is done here);
- `batch_shape`: which requests may share a call (serve/model/batch_shape.py; None: rows of one shape);
- `warm_up`, `info` (its fields of GET /info), `trouble`, `client_fault`: optional, with defaults;
- a `ProtocolTask` (every task but a language model's) also answers the Open Inference Protocol: its inputs and
  outputs (`protocol_tensors`) and its `infer` (required there), on requests serve/protocols/oip_codec.py has
  parsed (through the same batcher: `Serving.batched`).

A missing required method fails when the task is made, at load (an abstract method), never at a request.

A task never sees HTTP: it gets an `Incoming` (the body the front door read, its parameters) and gives an `Answer`,
or raises the one client error (contract/errors.py) where the request is wrong.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from contract.errors import ClientError
from contract.manifest import Manifest
from contract.signature import Signature, read_signature
from serve.config import ServeConfig
from serve.http.endpoint import (
    ERROR,
    HANDOFF,
    JSON_OBJECT,
    MODEL_ERRORS,
    Answer,
    Endpoint,
    Handler,
    Incoming,
    plain_error,
)
from serve.http.form import small_integer
from serve.http.front_door import MULTIPART, BodyRoute
from serve.http.json_body import parse_json
from serve.model.batch_shape import BatchShape
from serve.model.batching import ModelFailed
from serve.model.decode_pool import DecodePool
from serve.model.lanes import Lanes
from serve.model.runtime import Runtime
from serve.model.tensor_inputs import check_answer_size, json_inputs, model_inputs, outputs_json
from serve.protocols.oip_codec import OIP_DATATYPE, InferRequest, OutputTensor
from serve.protocols.tensors import ServedTensor, select_outputs

Rows = Any  # one array, or named arrays: what a task's decode gives and its `run` takes
TOP_K = {"type": "integer", "minimum": 1, "maximum": 1000, "default": 5}  # top_k's schema: `checked_top_k` checks it
BINARY = {"type": "string", "format": "binary"}
FIELD_SCHEMAS = {"file": BINARY, "integer": TOP_K, "text": {"type": "string"}}  # a form's one integer is top_k


@dataclass(frozen=True)
class Serving:
    """What a task is given: the export it serves, the runtime, the settings and the service's shared parts."""

    manifest: Manifest
    folder: Path
    runtime: Runtime
    config: ServeConfig
    decoders: DecodePool
    """decoding threads: a request's CPU-bound decoding runs here, never on the event loop"""
    batched: Callable[[Rows], Awaitable[dict[str, np.ndarray]]]
    """the model's outputs for some rows, batched with every other request's"""


class ServedTask(ABC):
    """The protocol, with the defaults most tasks keep. serve/tasks/__init__.py maps a manifest's task to its class."""

    name: ClassVar[str]
    """the manifest's `task`"""
    kind: ClassVar[str]
    """what the model is, in words, for a person (GET /info, the page): a detector, a text classifier, ..."""
    runs_alone: ClassVar[bool] = False
    """each request's rows run in a call of their own (images of their own sizes): never padded to warm sizes"""
    batch_shape: BatchShape | None = None

    def __init__(self, serving: Serving) -> None:
        self.serving = serving
        self.manifest = serving.manifest
        self.config = serving.config
        self.signature: Signature = read_signature(serving.manifest)

    @classmethod
    def own_runtime(cls, config: ServeConfig, folder: Path, manifest: Manifest) -> tuple[Lanes, Runtime] | None:
        """A task whose model is not the signature's one call (a language model's generator) loads it here, from
        the manifest's verified bytes; None (the default): the service loads the signature's model, with lanes."""
        return None

    @abstractmethod
    def endpoints(self) -> list[Endpoint]:
        """The routes this task answers, its main one first (each row's handler one of its methods)."""

    def run(self, rows: Rows) -> dict[str, np.ndarray]:
        """The model on a batch, in the model thread."""
        return self.serving.runtime.run_named(rows)

    def warm_up(self) -> None:
        """Run the model once at load, where the shapes it will see are known, so the first request is not slow
        (by default nothing: a task whose shapes vary warms up at its first requests)."""
        return None

    def trouble(self) -> str | None:
        """Why the task cannot answer now though it loaded (the readiness probes say it); None: it can."""
        return None

    def client_fault(self, failed: ModelFailed) -> ClientError | None:
        """The client's error when the model failed on one request's rows alone; None: the fault is the service's."""
        return None

    def info(self) -> dict[str, Any]:
        """The task's own fields in GET /info's `model`."""
        return {"dynamic": self.manifest.get("dynamic", {})}

    # Shared by the tasks that take tensors by name (any model, and a text model's token ids).

    async def predict_named(self, request: Incoming) -> Answer:
        """POST /predict's `{"inputs": {name: nested list}}` -> `{"outputs": {name: nested list}}`."""
        only_params(request.params, set())
        inputs = await self.serving.decoders.run(self._parse_inputs, request.body)
        outputs = {name: a for name, a in (await self.serving.batched(inputs)).items() if name != "order"}
        check_answer_size(outputs, self.config.max_answer_numbers)
        return Answer(await self.serving.decoders.run(outputs_json, outputs))  # in a thread: it may be megabytes

    def _parse_inputs(self, body: bytes) -> dict[str, np.ndarray]:
        return model_inputs(json_inputs(parse_json(body), self.signature), self.signature, self.config.max_batch_size)

    def predict_route(self) -> Endpoint:
        """POST /predict for the signature's inputs and outputs by name (`predict_named`)."""

        def tensors(specs: Any) -> dict[str, Any]:
            return {
                "type": "object",
                "properties": {t.name: {"type": "array", "description": f"{t.dtype} {list(t.shape)}"} for t in specs},
                "required": [t.name for t in specs],
            }

        body = {"type": "object", "properties": {"inputs": tensors(self.signature.inputs)}, "required": ["inputs"]}
        answer = {"type": "object", "properties": {"outputs": tensors(self.signature.outputs)}}
        return json_route(
            "/predict",
            "the model's outputs by name for its inputs by name (token ids for a text model)",
            self.predict_named,
            body,
            answer,
        )


class ProtocolTask(ServedTask):
    """A task the Open Inference Protocol's infer reaches (every task but a language model's): its tensors, the
    signature's by default, and its infer, required."""

    def protocol_tensors(self) -> tuple[list[ServedTensor], list[ServedTensor]]:
        """The protocol's inputs and outputs: the signature's, by default."""
        inputs = [ServedTensor(t.name, OIP_DATATYPE[t.dtype], t.shape) for t in self.signature.inputs]
        outputs = [ServedTensor(t.name, OIP_DATATYPE[t.dtype], t.shape) for t in self.signature.outputs]
        return inputs, outputs

    @abstractmethod
    async def infer(self, request: InferRequest) -> list[OutputTensor]:
        """The protocol's infer on a request serve/protocols/oip_codec.py has parsed."""

    async def infer_named(self, request: InferRequest) -> list[OutputTensor]:
        """The protocol's infer on the signature's inputs, numbers only."""
        given = numeric_inputs(request, list(request.inputs))
        outputs = await self.serving.batched(model_inputs(given, self.signature, self.config.max_batch_size))
        check_answer_size(outputs, self.config.max_answer_numbers)
        return select_outputs(request, outputs, None)


def json_route(
    path: str,
    summary: str,
    handler: Handler,
    body: dict[str, Any],
    answer: dict[str, Any] = JSON_OBJECT,
    *,
    max_bytes: int | None = None,
    media_types: dict[str, dict[str, Any]] | None = None,
    takes: str = "",
    query: tuple[dict[str, Any], ...] = (),
    error_body: Callable[[ClientError], dict[str, Any]] = plain_error,
    error_schema: dict[str, Any] = ERROR,
) -> Endpoint:
    """A model's POST route that takes a JSON `body` (its schema), or the `media_types` given (their schemas), and
    answers JSON; `max_bytes`: its own limit below HANDOFF_MAX_BODY_MB; `takes`: its 415's words."""
    request = media_types or {"application/json": {"schema": body}}
    body_route = BodyRoute(frozenset(request), max_bytes=max_bytes, takes=takes)
    return model_route(
        path, summary, handler, body_route, request, ("application/json", answer), query, error_body, error_schema
    )


def model_route(
    path: str,
    summary: str,
    handler: Handler,
    body: BodyRoute,
    request: dict[str, Any],
    answer: tuple[str, dict[str, Any]],
    query: tuple[dict[str, Any], ...] = (),
    error_body: Callable[[ClientError], dict[str, Any]] = plain_error,
    error_schema: dict[str, Any] = ERROR,
) -> Endpoint:
    """A model's POST route: the body the front door reads for it (`body`), its OpenAPI request (`request`, by media
    type) and answer, answered by `handler`. `json_route` and serve/tasks/images.py's `image_route` make one."""
    return Endpoint(
        "POST",
        path,
        summary,
        HANDOFF,
        handler,
        body,
        request=request,
        query=query,
        answer=answer,
        errors=MODEL_ERRORS,
        error_body=error_body,
        error_schema=error_schema,
    )


def file_route(
    path: str,
    summary: str,
    handler: Handler,
    answer: tuple[str, dict[str, Any]],
    form_fields: dict[str, str],
    media_types: tuple[str, ...],
    takes: str,
    query: tuple[dict[str, Any], ...] = (),
    error_body: Callable[[ClientError], dict[str, Any]] = plain_error,
    error_schema: dict[str, Any] = ERROR,
) -> Endpoint:
    """A model's POST route that takes one file: a multipart form of `form_fields` (the file's field among them) or
    the file itself as the body, of one of `media_types`; `takes`: its 415's words."""
    body = BodyRoute(frozenset({MULTIPART, *media_types}), form_fields, takes=takes)
    request = {MULTIPART: {"schema": form_schema(form_fields)}, **{t: {"schema": BINARY} for t in media_types}}
    return model_route(path, summary, handler, body, request, answer, query, error_body, error_schema)


def form_schema(form_fields: dict[str, str]) -> dict[str, Any]:
    """The OpenAPI schema of a multipart form of `form_fields` ({name: "file" | "integer" | "text"})."""
    return {
        "type": "object",
        "properties": {name: FIELD_SCHEMAS[kind] for name, kind in form_fields.items()},
        "required": [name for name, kind in form_fields.items() if kind == "file"],
    }


def only_params(params: dict[str, list[str]], allowed: set[str]) -> None:
    unknown = sorted(set(params) - allowed)
    if unknown:
        expected = f"expected {', '.join(sorted(allowed))}" if allowed else "this endpoint takes none"
        raise ClientError(f"unknown query parameter(s) {', '.join(unknown)}; {expected}")


def numeric_inputs(request: InferRequest, names: list[str]) -> dict[str, np.ndarray]:
    """The values of inputs `names`, refusing a BYTES tensor where the model takes numbers."""
    given = {}
    for name in names:
        tensor = request.inputs[name]
        if tensor.datatype == "BYTES":
            raise ClientError(f"input {name!r}: BYTES; this model takes numbers")
        given[name] = tensor.value
    return given


def one_param(params: dict[str, list[str]], name: str, default: str) -> str:
    values = params.get(name, [default])
    if len(values) > 1:
        raise ClientError(f"{name} is given {len(values)} times; send it once")
    return values[0]


def checked_top_k(value: Any) -> int:
    """top_k from a form or query string (ASCII digits: not '²' or '①') or a JSON body (a number), 1 to 1000."""
    whole = isinstance(value, int) and not isinstance(value, bool)
    digits = isinstance(value, str) and small_integer(value) and len(value) <= 4
    top_k = int(value) if whole or digits else 0
    if not 1 <= top_k <= 1000:
        raise ClientError(f"top_k={str(value)[:20]}: must be between 1 and 1000")
    return top_k
