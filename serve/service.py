"""The HTTP service: an exported classifier behind ONNX Runtime (or TorchScript), with adaptive batching.

From the repo root (bentofile.yaml names this class):
    HANDOFF_MODEL_DIR=runs/demo/last.export bentoml serve        # an export folder
    bentoml serve                                                # the newest `handoff` model in the store
Settings (environment, all in serve/config.py): HANDOFF_RUNTIME=onnx|torchscript, HANDOFF_DEVICE=auto|cpu|cuda,
HANDOFF_WORKERS, HANDOFF_MODEL_SHA256, HANDOFF_MAX_BATCH_SIZE, HANDOFF_MAX_LATENCY_MS, ...

Every route, and who answers it, is one table: serve/routes.py. BentoML is configured through its settings
(SERVICE_CONFIG below) and handoff's middlewares are added with add_asgi_middleware; serve/patches.py holds the two
replacements of upstream code that have no public way in, each checked before the service reports ready.

Decoding and preprocessing run in worker threads outside the batched call; only validated tensors
reach the batcher (serve/batching.py), so a bad request can never fail the good ones batched with it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bentoml
import numpy as np
from bentoml import get_current_service
from bentoml.exceptions import BentoMLException
from starlette.applications import Starlette

from export.manifest import ManifestError, fast_decode_passed, read_artifact, read_manifest
from export.signature import (
    TASK_IMAGE_CLASSIFICATION,
    TASK_OBJECT_DETECTION,
    TASK_SEMANTIC_SEGMENTATION,
    TASK_TENSORS,
    TASK_TEXT_CLASSIFICATION,
    read_signature,
    read_task,
)
from serve import patches
from serve.access_log import AccessLine, write_access_log_off_the_loop
from serve.auth import ApiKeyGate
from serve.batching import BatchShape, ModelBatcher, ModelFailed, Rows
from serve.config import ServeConfig
from serve.connections import ConnectionLimits
from serve.decode_pool import DecodePool
from serve.detection import Detector
from serve.endpoint import app_routes, body_routes, known_paths, open_paths
from serve.front_door import FrontDoor
from serve.handlers import RequestError, checked_top_k
from serve.info import service_info
from serve.json_body import BadJson, float32_rows, max_json_bytes, parse_json
from serve.logs import install_log_filters
from serve.oip import ProtocolSurface
from serve.oip_codec import InferRequest, OutputTensor, ProtocolError
from serve.oip_infer import classifier_infer, image_task_infer, tensor_infer, text_infer
from serve.request_metrics import RequestMetrics
from serve.routes import endpoints
from serve.runtime import RuntimeUnavailable, best_first, load_runtime, softmax
from serve.segmentation import Segmenter
from serve.tensor_inputs import check_answer_size, json_inputs, model_inputs, outputs_json
from serve.text import BadText, TextModel
from serve.tracing import service_tracing
from train.pil_transform import BadImage, Preprocessor

log = logging.getLogger("bentoml.handoff")  # under "bentoml", so `bentoml serve` shows it
CONFIG = ServeConfig()
VERSION = "0.1.0"


install_log_filters()
CONNECTION_LIMITS = ConnectionLimits(
    CONFIG.max_connections,
    CONFIG.header_timeout_s,
    CONFIG.idle_timeout_s,
    CONFIG.keep_alive_s,
    CONFIG.max_header_kb * 1024,
    CONFIG.write_timeout_s,
)
patches.install(CONNECTION_LIMITS)  # the two last resorts, checked when the service is asked if it is ready

PROTOCOL = ProtocolSurface(CONFIG.model_name, VERSION, get_current_service)
ROUTES = endpoints(PROTOCOL, "handoff", VERSION)  # every route the service answers: serve/routes.py
# BentoML's settings: no metrics or access log of its own (handoff's middlewares below give both, cheaper and
# bounded), no spans unless the user's configuration traces (serve/tracing.py), and no concurrency limit of
# its own (its slot is taken before the body is read; the front door takes its own after).
SERVICE_CONFIG: dict[str, Any] = {
    "workers": CONFIG.workers,
    "traffic": {"timeout": CONFIG.timeout_s},
    "metrics": {"enabled": False},
    "logging": {"access": {"enabled": False}},
    "tracing": service_tracing(),
}
info_app = Starlette(routes=app_routes(ROUTES))


@bentoml.asgi_app(info_app, path="/")
@bentoml.service(name="handoff", **SERVICE_CONFIG)
class HandoffClassifier:
    # Declared at class level only so that `bentoml build` packs the model into the Bento; the service finds
    # its folder through CONFIG.locate_model() (HANDOFF_MODEL_DIR, else this store model).
    bento_model = None if CONFIG.model_dir else bentoml.models.BentoModel(f"{CONFIG.model_name}:latest")

    def __init__(self) -> None:
        write_access_log_off_the_loop()  # here, in the server's worker, not in `bentoml build` importing this file
        self.load_failure: str | None = None
        self.patches_in_effect = False
        self.batcher: ModelBatcher | None = None
        # Decoding is CPU-bound and a large image takes hundreds of MB while it is decoded: one per core (of this
        # worker's share) at a time bounds both (BentoML's default thread pool would decode 40 at once).
        self.decoders = DecodePool(CONFIG.cores_per_worker())
        self.model_threads = CONFIG.model_threads()  # read once: /info reports what the runtime was built with
        started = time.monotonic()
        try:
            self._load()
        except (ManifestError, RuntimeUnavailable, ValueError, OSError, BentoMLException) as err:
            self.load_failure = self._short(str(err))
            log.error("not ready: %s", err)
            return
        except Exception as err:  # noqa: BLE001 - stay up and say why rather than crash-loop the worker
            self.load_failure = self._short(f"cannot load the model: {type(err).__name__}: {err}")
            log.exception("not ready")
            return
        log.info(
            "ready in %.1fs: %s on %s (%s), warm for batch sizes %s",
            time.monotonic() - started,
            self.manifest["arch"],
            self.runtime.device,
            self.runtime.provider,
            CONFIG.batch_buckets(),
        )

    def _load(self) -> None:
        self.folder = CONFIG.locate_model()
        self.manifest = read_manifest(self.folder, CONFIG.model_sha256)
        # Served only from bytes checked against the manifest: a tampered, missing or unlisted file is refused.
        self.runtime = load_runtime(
            CONFIG.runtime,
            self.folder,
            self.manifest,
            CONFIG.device,
            CONFIG.precision,
            CONFIG.tensorrt_cache if CONFIG.tensorrt == "1" else None,
            self.model_threads,
        )
        self.task, self.signature = read_task(self.manifest), read_signature(self.manifest)
        self.classes: list[str] | None = None
        self.text: TextModel | None = None
        self.detector = Detector(self.manifest, CONFIG.max_pixels) if self.task == TASK_OBJECT_DETECTION else None
        segments = self.task == TASK_SEMANTIC_SEGMENTATION
        self.segmenter = Segmenter(self.manifest, CONFIG.max_pixels) if segments else None
        if self.task == TASK_TEXT_CLASSIFICATION:  # its tokenizer, from the bytes the manifest vouches for
            tokenizer = read_artifact(self.folder, self.manifest, self.manifest["tokenizer"]["file"])
            self.text = TextModel(tokenizer, self.manifest, CONFIG.max_text_chars, CONFIG.max_batch_tokens)
        if self.task != TASK_IMAGE_CLASSIFICATION:
            return  # no warm-up, since the values a dynamic dimension takes are not known in advance
        self.preprocessor = Preprocessor.from_manifest(self.manifest["preprocess"], CONFIG.max_pixels)
        self.fast_decode = CONFIG.decode == "auto" and fast_decode_passed(self.manifest)
        self.input_shape = tuple(self.manifest["input"]["shape"][1:])
        self.classes = self.manifest["classes"]
        for size in CONFIG.batch_buckets():  # so the first real request is not the slow one
            self.runtime(np.zeros((size, *self.input_shape), dtype=np.float32))

    def padded_batch_sizes(self) -> list[int] | None:
        """On a GPU, batches run only at the sizes warmed up in _load (see serve/batching.py for why); a detector's
        images run one per call, never padded."""
        one_each = self.detector or self.segmenter
        return CONFIG.batch_buckets() if self.runtime.device == "cuda" and not one_each else None

    @property
    def not_ready(self) -> str | None:
        """Why the service cannot answer yet (None: it can): the model did not load, or one of serve/patches.py's
        replacements did not take effect in this bentoml or uvicorn."""
        if self.load_failure is None and not self.patches_in_effect:
            reason = patches.not_in_effect()
            if reason is not None:
                return reason
            self.patches_in_effect = True  # asked again only until it holds
        return self.load_failure

    @property
    def unready(self) -> str | None:
        """What the readiness probes say: `not_ready`, or the batcher refusing every request of late (requests are
        still taken: one that finds the model idle runs, and ends it)."""
        return self.not_ready or (self.batcher.refusing if self.batcher is not None else None)

    def __is_ready__(self) -> bool:
        return self.unready is None

    def require_ready(self) -> None:
        if self.not_ready is not None:
            raise RequestError(f"model not ready: {self.not_ready}", status=503)

    async def batched(self, rows: Rows) -> Any:
        """The model's answer for `rows`, batched with every other request: for a classifier's array N x C x H x W,
        its `logits`, `probabilities` and each row's classes best first (`order`); any model's outputs by name
        for its inputs by name."""
        if self.batcher is None:  # created on the server's event loop, at the first request
            model: dict[str, Callable[[Any], Any]] = {
                TASK_IMAGE_CLASSIFICATION: self._classify_batch,
                TASK_TEXT_CLASSIFICATION: self._classify_texts,
                TASK_SEMANTIC_SEGMENTATION: lambda rows: Segmenter.classes(self.runtime.run_named(rows)["logits"]),
            }
            self.batcher = ModelBatcher(
                model.get(self.task, self.runtime.run_named),
                CONFIG.max_batch_size,
                CONFIG.max_latency_ms,
                self.padded_batch_sizes(),
                self.decoders,
                self._batch_shape(),
            )
        try:
            return await self.batcher(rows)
        except ModelFailed as failed:
            if self.task != TASK_TENSORS:  # rows handoff decoded or tokenized itself: the fault is not the client's
                raise failed.cause from None
            # Any model's inputs passed the signature, yet the model refused them alone (an index out of its
            # vocabulary, a shape it cannot take): the client's input, named in a 400 and one log line.
            raise RequestError(
                f"the model could not run on these inputs ({self._input_names()}): {failed.first_line()}"
            ) from None

    def _batch_shape(self) -> BatchShape | None:
        """Texts of any length share a batch, padded (serve/text.py); a detector's or segmenter's images of any
        size, each run alone (serve/detection.py); else requests of one shape (serve/batching.py's default)."""
        task_model = self.text or self.detector or self.segmenter
        return None if task_model is None else task_model.batch_shape

    def _classify_batch(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        """In the model thread, once per batch: the softmax and the ranking as well as the logits. NumPy's sorts
        release the GIL, and an argsort per request on the event loop handed the GIL to a decoding thread for up
        to its 5 ms switch interval each time (py-spy: 11% of the loop's samples at c=64, digits model)."""
        return self._ranked(self.runtime(batch))

    def _classify_texts(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """As _classify_batch, for a text classifier's padded token rows."""
        return self._ranked(self.runtime.run_named(rows)["logits"])

    @staticmethod
    def _ranked(logits: np.ndarray) -> dict[str, np.ndarray]:
        probabilities = softmax(logits)
        return {"logits": logits, "probabilities": probabilities, "order": best_first(probabilities)}

    @staticmethod
    def _predictions(outputs: dict[str, np.ndarray], labels: list[str], top_k: int) -> list[dict[str, Any]]:
        probabilities = outputs["probabilities"][0].tolist()
        return [
            {"label": labels[i], "index": i, "probability": probabilities[i]}
            for i in outputs["order"][0, :top_k].tolist()
        ]

    async def classify_upload(self, upload: bytes, top_k: int) -> dict[str, Any]:
        """The /classify answer for one image: the multipart form's file, or a raw body's bytes."""
        self.require_ready()
        if self.text is not None:
            raise RequestError('this model classifies text: send {"text": "..."} (application/json) or text/plain', 415)
        if self.detector or self.segmenter:
            route = "/detect" if self.detector else "/segment"
            raise RequestError(f"/classify is for classifiers; this model takes an image: POST {route}", status=404)
        if self.classes is None:
            raise RequestError(
                f"/classify is for image classifiers; this model takes {self._input_names()}: POST /predict "
                f'{{"inputs": {{...}}}} or /v2/models/{CONFIG.model_name}/infer',
                status=404,
            )
        top_k = checked_top_k(top_k)
        array = await self.decoders.run(self._prepare, upload)
        outputs = await self.batched(array[None])
        return {"predictions": self._predictions(outputs, self.classes, top_k)}

    async def classify_text(self, body: bytes, content_type: str, params: dict[str, list[str]]) -> dict[str, Any]:
        """The /classify answer for a text (JSON or text/plain), tokenized in a thread."""
        self.require_ready()
        if self.text is None:
            raise RequestError(
                f"/classify with {content_type}: this model classifies images, sent as multipart/form-data "
                "(field image) or as the image itself (image/jpeg, image/png, image/webp, image/bmp, image/gif)",
                415,
            )
        try:
            encoded, top_k = await self.decoders.run(self.text.encode_body, body, content_type, params)
        except BadText as err:
            raise RequestError(str(err), status=err.status) from None
        top_k = checked_top_k(top_k)
        outputs = await self.batched(encoded.rows)
        return {"predictions": self._predictions(outputs, self.text.labels, top_k), "truncated": encoded.truncated[0]}

    def _prepare(self, upload: bytes) -> np.ndarray:
        try:
            return self.preprocessor(self.preprocessor.decode(upload, fast=self.fast_decode))
        except BadImage as err:
            raise RequestError(str(err), status=err.status) from None

    async def predict_json(self, body: bytes) -> dict[str, Any] | bytes:
        """The /predict answer for a JSON body, parsed and checked in a thread: a classifier's
        `{"tensor": N x C x H x W}`, any model's `{"inputs": {name: nested list}}` -> `{"outputs": {...}}`."""
        self.require_ready()
        if self.task == TASK_IMAGE_CLASSIFICATION:
            batch = await self.decoders.run(self._parse_predict, body)
            return await self.predict_rows(batch)
        if self.detector or self.segmenter:
            route = "/detect" if self.detector else "/segment"
            raise RequestError(f"/predict takes tensors; this model takes an image: POST {route}", status=404)
        inputs = await self.decoders.run(self._parse_inputs, body)
        outputs = {name: a for name, a in (await self.batched(inputs)).items() if name != "order"}
        try:
            check_answer_size(outputs, CONFIG.max_answer_numbers)
        except ProtocolError as err:
            raise RequestError(str(err), status=err.status) from None
        return await self.decoders.run(outputs_json, outputs)  # converted in a thread: it may be megabytes

    def _parse_inputs(self, body: bytes) -> dict[str, np.ndarray]:
        try:
            return model_inputs(json_inputs(parse_json(body), self.signature), self.signature, CONFIG.max_batch_size)
        except (BadJson, ProtocolError) as err:
            raise RequestError(str(err)) from None

    def _input_names(self) -> str:
        return ", ".join(t.name for t in self.signature.inputs)

    def _parse_predict(self, body: bytes) -> np.ndarray:
        try:
            document = parse_json(body)
            if not isinstance(document, dict) or set(document) != {"tensor"}:
                raise BadJson('expected a JSON object with one key, "tensor": {"tensor": [[[[...]]]]}')
            return float32_rows(document["tensor"], "tensor", self.input_shape, CONFIG.max_batch_size)
        except BadJson as err:
            raise RequestError(str(err)) from None

    async def predict_rows(self, batch: np.ndarray) -> dict[str, Any]:
        outputs = await self.batched(batch)
        return {"logits": outputs["logits"].tolist(), "probabilities": outputs["probabilities"].tolist()}

    def max_predict_bytes(self) -> int:
        """The largest /predict body worth reading: a full batch of this model's input, as JSON text (any model
        with a dynamic dimension: the body limit alone)."""
        if self.not_ready is not None or self.task != TASK_IMAGE_CLASSIFICATION:
            return CONFIG.max_body_bytes
        return max_json_bytes(CONFIG.max_batch_size, self.input_shape)

    async def protocol_infer(self, request: InferRequest) -> list[OutputTensor]:
        """The protocol's infer, through the same batcher as every other route (serve/oip_infer.py)."""
        if self.task == TASK_IMAGE_CLASSIFICATION:
            return await classifier_infer(self, request, CONFIG.max_batch_size)
        if self.task == TASK_TEXT_CLASSIFICATION:
            return await text_infer(self, request, CONFIG.max_batch_size)
        if self.task in (TASK_OBJECT_DETECTION, TASK_SEMANTIC_SEGMENTATION):
            return await image_task_infer(self, request, CONFIG.max_batch_size, CONFIG.max_answer_numbers)
        return await tensor_infer(self, request, CONFIG.max_batch_size, CONFIG.max_answer_numbers)

    def prepare_files(self, files: list[bytes]) -> np.ndarray:
        """Encoded images -> the model's rows, each decoded and preprocessed as /classify does (in a thread)."""
        rows = []
        for index, data in enumerate(files):
            try:
                rows.append(self._prepare(data))
            except RequestError as err:
                raise RequestError(f"image[{index}]: {err}", status=err.error_code.value) from None
        return np.stack(rows)

    def platform(self) -> str:
        """The model's platform as Triton names it."""
        return "pytorch_libtorch" if self.runtime.name == "torchscript" else "onnxruntime_onnx"

    @staticmethod
    def max_batch_size() -> int:
        return CONFIG.max_batch_size

    @staticmethod
    def _short(reason: str) -> str:
        """The not-ready reason /info gives: the model folder by its name unless HANDOFF_SHOW_PATHS=1."""
        folder = CONFIG.model_dir
        return reason if CONFIG.show_paths or not folder else reason.replace(str(Path(folder).parent) + "/", "")

    def describe(self) -> dict[str, Any]:
        """What is being served, and on what (GET /info)."""
        return service_info(self, CONFIG, VERSION, PROTOCOL.describe())


SERVICE: Any = HandoffClassifier  # the bentoml.Service the decorator made: its middlewares, outermost first
if CONFIG.access_log:
    SERVICE.add_asgi_middleware(AccessLine)
SERVICE.add_asgi_middleware(RequestMetrics, known_paths=known_paths(ROUTES, CONFIG.model_name))
SERVICE.add_asgi_middleware(ApiKeyGate, keys=CONFIG.api_keys, open_paths=open_paths(ROUTES, CONFIG.model_name))
SERVICE.add_asgi_middleware(
    FrontDoor,
    max_bytes=CONFIG.max_body_bytes,
    routes=body_routes(ROUTES, CONFIG.model_name),
    max_concurrency=CONFIG.max_concurrency,
    body_timeout_s=CONFIG.body_timeout_s,
    max_connections=CONNECTION_LIMITS.effective_max(),
)
