"""The HTTP service: an exported model behind ONNX Runtime (or TorchScript), with adaptive batching.

From the repo root (bentofile.yaml names this class):
    HANDOFF_MODEL_DIR=runs/demo/last.export bentoml serve        # an export folder
    bentoml serve                                                # the newest `handoff` model in the store
Settings (environment, all in serve/config.py): HANDOFF_RUNTIME=onnx|torchscript, HANDOFF_DEVICE=auto|cpu|cuda,
HANDOFF_WORKERS, HANDOFF_MODEL_SHA256, HANDOFF_MAX_BATCH_SIZE, HANDOFF_MAX_LATENCY_MS, ...

The service is thin: it loads the manifest (only bytes it vouches for are served), picks the task that serves the
manifest's `task` (serve/tasks/), the runtime and the batcher. Every route, and who answers it, is one table
(serve/http/routes.py's routes every model has, and the served task's own, added as it loads), dispatched by one router
(serve/http/router.py). BentoML is configured through its settings
(SERVICE_CONFIG below); handoff's middlewares are called by uvicorn in front of BentoML's app (serve/http/front.py), or
added to it with add_asgi_middleware where the user traces; serve/patches.py holds the two replacements of upstream
code that have no public way in, each checked before the service reports ready.

Decoding and preprocessing run in worker threads outside the batched call; only validated rows reach the batcher
(serve/model/batching.py), so a bad request can never fail the good ones batched with it.
"""

from __future__ import annotations

import gc
import logging
import time
from pathlib import Path
from typing import Any

import bentoml
from bentoml import get_current_service
from bentoml.exceptions import BentoMLException

from contract.errors import ClientError
from contract.manifest import ManifestError, read_manifest
from contract.signature import read_signature
from serve import patches
from serve.config import ServeConfig
from serve.http.auth import ApiKeyGate
from serve.http.connections import ConnectionLimits
from serve.http.deadline import ResponseDeadline
from serve.http.endpoint import open_paths
from serve.http.front import Front
from serve.http.front_door import FrontDoor
from serve.http.router import Router
from serve.http.routes import route_table
from serve.info import service_info
from serve.model.batching import ModelBatcher, ModelFailed
from serve.model.decode_pool import DecodePool
from serve.model.lanes import Lanes, arrange
from serve.model.runtime import RuntimeUnavailable, load_runtime
from serve.observability.access_log import AccessLine, write_access_log_off_the_loop
from serve.observability.logs import install_log_filters
from serve.observability.request_metrics import RequestMetrics
from serve.observability.tracing import service_tracing
from serve.protocols.oip import ProtocolSurface
from serve.tasks import ServedTask, Serving, task_for
from serve.tasks.base import ProtocolTask

log = logging.getLogger("bentoml.handoff")  # under "bentoml", so `bentoml serve` shows it
CONFIG = ServeConfig()
VERSION = "0.1.0"
YOUNG_GENERATION_THRESHOLD = 10_000  # objects made and not yet freed before the garbage collector runs (see _load)


install_log_filters()
CONNECTION_LIMITS = ConnectionLimits(
    CONFIG.max_connections,
    CONFIG.header_timeout_s,
    CONFIG.idle_timeout_s,
    CONFIG.keep_alive_s,
    CONFIG.max_header_kb * 1024,
    CONFIG.write_timeout_s,
)

PROTOCOL = ProtocolSurface(CONFIG.model_name, VERSION, get_current_service)
# every route the service answers: serve/http/routes.py's, and the served task's once it has loaded (ModelService._load)
ROUTES = route_table(PROTOCOL, lambda: get_current_service().describe(), "handoff", VERSION, CONFIG.model_name)
# BentoML's settings: no metrics or access log of its own (handoff's middlewares below give both, cheaper and
# bounded), no spans unless the user's configuration traces (serve/observability/tracing.py), and no concurrency limit
# of its own (its slot is taken before the body is read; the front door takes its own after).
SERVICE_CONFIG: dict[str, Any] = {
    "workers": CONFIG.workers,
    "traffic": {"timeout": CONFIG.timeout_s},
    "metrics": {"enabled": False},
    "logging": {"access": {"enabled": False}},
    "tracing": service_tracing(),
}


@bentoml.service(name="handoff", **SERVICE_CONFIG)
class ModelService:
    # Declared at class level only so that `bentoml build` packs the model into the Bento; the service finds
    # its folder through CONFIG.locate_model() (HANDOFF_MODEL_DIR, else this store model).
    bento_model = None if CONFIG.model_dir else bentoml.models.BentoModel(f"{CONFIG.model_name}:latest")

    def __init__(self) -> None:
        write_access_log_off_the_loop()  # here, in the server's worker, not in `bentoml build` importing this file
        self.config = CONFIG
        self.load_failure: str | None = None
        self.patches_in_effect = False
        self.batcher: ModelBatcher | None = None
        # Decoding is CPU-bound and a large image takes hundreds of MB while it is decoded: one per core (of this
        # worker's share) at a time bounds both (BentoML's default thread pool would decode 40 at once).
        self.decoders = DecodePool(CONFIG.cores_per_worker())
        self.lanes: Lanes | None = None  # how the model runs on a CPU (serve/model/lanes.py), chosen at load
        try:
            self._load()
        except (ManifestError, RuntimeUnavailable, ValueError, OSError, BentoMLException) as err:
            self.load_failure = self._short(str(err))
            log.error("not ready: %s", err)
        except Exception as err:  # noqa: BLE001 - stay up and say why rather than crash-loop the worker
            self.load_failure = self._short(f"cannot load the model: {type(err).__name__}: {err}")
            log.exception("not ready")
        if self.load_failure is not None:
            ROUTES.failed(self.load_failure)  # the model's routes are unknown: every other path is a 503

    def _load(self) -> None:
        started = time.monotonic()
        self.folder = CONFIG.locate_model()
        self.manifest = read_manifest(self.folder, CONFIG.model_sha256)
        task = task_for(self.manifest)
        # Served only from bytes checked against the manifest: a tampered, missing or unlisted file is refused.
        self.lanes, self.runtime = task.own_runtime(CONFIG, self.folder, self.manifest) or arrange(
            CONFIG,
            read_signature(self.manifest),
            lambda threads: load_runtime(
                CONFIG.runtime,
                self.folder,
                self.manifest,
                CONFIG.device,
                CONFIG.precision,
                CONFIG.tensorrt_cache if CONFIG.tensorrt == "1" else None,
                threads,
            ),
            task.runs_alone,
        )
        self.task: ServedTask = task(
            Serving(self.manifest, self.folder, self.runtime, CONFIG, self.decoders, self.batched)
        )
        self.task.warm_up()
        ROUTES.serve(self.task.name, self.task.endpoints(), self.require_room)
        log.info(
            "ready in %.1fs: %s (%s) on %s (%s), %d lane(s) of %d thread(s), batches up to %d",
            time.monotonic() - started,
            self.manifest["arch"],
            self.task.name,
            self.runtime.device,
            self.runtime.provider,
            self.lanes.count,
            self.lanes.threads,
            self.lanes.max_batch_size,
        )
        # What is alive now (BentoML, the runtime, the model: ~100,000 objects) lives as long as the worker. Frozen,
        # the cyclic garbage collector no longer walks it at each full collection (one every few thousand requests
        # under load): the in-process stack at c=64 spent 16 us a request collecting garbage, 5.5 us frozen.
        gc.collect()
        gc.freeze()
        # The youngest generation is collected when 700 more objects were made than freed (Python's default): at
        # c=64 the requests in flight hold thousands, so a collection came every ~14 requests and walked them all,
        # 17-22 us of CPU a request, served. A request leaves no cyclic garbage of its own (answered
        # or refused: only reference counting frees what it made), so the threshold is set above what requests in
        # flight hold: collections become rare and still come where something does leave cycles.
        gc.set_threshold(YOUNG_GENERATION_THRESHOLD, *gc.get_threshold()[1:])

    def padded_batch_sizes(self) -> list[int] | None:
        """On a GPU, batches run only at the sizes warmed up (see serve/model/batching.py for why); a task whose
        requests run alone (a detector's images) is never padded."""
        return CONFIG.batch_buckets() if self.runtime.device == "cuda" and not self.task.runs_alone else None

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
        """What the readiness probes say: `not_ready`, the task's own trouble (a language model's engine process
        gone), or the batcher refusing every request of late (requests are still taken: one that finds the model
        idle runs, and ends it)."""
        if self.not_ready is not None:
            return self.not_ready
        return self.task.trouble() or (self.batcher.refusing if self.batcher is not None else None)

    def __is_ready__(self) -> bool:
        return self.unready is None

    def require_ready(self) -> ModelService:
        if self.not_ready is not None:
            raise ClientError(f"model not ready: {self.not_ready}", 503)
        return self

    def require_room(self) -> ModelService:
        """Ready, and the model not so far behind that a request would wait past its budget: checked before a
        request is decoded (the batcher checks again with its rows), so an overloaded service refuses cheaply."""
        self.require_ready()
        if self.batcher is not None:
            self.batcher.admit(1)
        return self

    async def batched(self, rows: Any) -> Any:
        """The model's outputs for `rows` (the task's `run`), batched with every other request's."""
        if self.batcher is None:  # created on the server's event loop, at the first request
            assert self.lanes is not None  # set by _load, which a ready service has passed
            self.batcher = ModelBatcher(
                self.task.run,
                self.lanes.max_batch_size,
                CONFIG.max_latency_ms,
                self.padded_batch_sizes(),
                self.decoders,
                self.task.batch_shape,
                self.lanes.count,
            )
        try:
            return await self.batcher(rows)
        except ModelFailed as failed:
            fault = self.task.client_fault(failed)
            if fault is None:  # rows handoff decoded or tokenized itself: the fault is not the client's
                raise failed.cause from None
            raise fault from None  # the client's input, named in a 400 and one log line

    def protocol_task(self) -> ProtocolTask:
        """The task, where it answers the protocol's infer (ClientError where it does not: a language model)."""
        if not isinstance(self.task, ProtocolTask):
            raise ClientError(
                f"{self.task.kind} is not served through the protocol's infer: it answers {ROUTES.answered()}"
            )
        return self.task

    def platform(self) -> str:
        """The model's platform as Triton names it."""
        return "pytorch_libtorch" if self.runtime.name == "torchscript" else "onnxruntime_onnx"

    @staticmethod
    def _short(reason: str) -> str:
        """The not-ready reason /info gives: the model folder by its name unless HANDOFF_SHOW_PATHS=1."""
        folder = CONFIG.model_dir
        return reason if CONFIG.show_paths or not folder else reason.replace(str(Path(folder).parent) + "/", "")

    def describe(self) -> dict[str, Any]:
        """What is being served, and on what (GET /info)."""
        return service_info(self, VERSION, PROTOCOL.describe(), ROUTES.task_rows)


SERVICE: Any = ModelService  # the bentoml.Service the decorator made
MIDDLEWARES: list[tuple[type, dict[str, Any]]] = [  # handoff's, outermost first
    *([(AccessLine, {})] if CONFIG.access_log else []),
    (RequestMetrics, {"known_paths": ROUTES}),
    (ApiKeyGate, {"keys": CONFIG.api_keys, "open_paths": open_paths(ROUTES.common, CONFIG.model_name)}),
    (
        Router,
        {
            "routes": ROUTES,
            "front_door": FrontDoor(
                CONFIG.max_body_bytes, CONFIG.max_concurrency, CONFIG.body_timeout_s, CONNECTION_LIMITS.effective_max()
            ),
        },
    ),
]
TRACED = not SERVICE_CONFIG["tracing"]  # serve/observability/tracing.py excludes every URL unless the user traces
if not TRACED:  # uvicorn calls the middlewares, in front of BentoML's app
    FRONT: Front | None = Front([(ResponseDeadline, {"timeout": CONFIG.timeout_s}), *MIDDLEWARES])
else:  # BentoML's app calls them, inside its span and its deadline
    FRONT = None
    for middleware, options in MIDDLEWARES:
        SERVICE.add_asgi_middleware(middleware, **options)
# The two last resorts, checked when the service is asked if it is ready; before BentoML builds its app.
patches.install(CONNECTION_LIMITS, FRONT.around if FRONT is not None else None)
