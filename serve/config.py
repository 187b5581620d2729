"""Service settings, read once from the environment (so `bentoml serve` needs no extra flags).

Each field names its environment variable once, in its metadata; `SETTINGS` lists them all, so the
docs/serve.md's table, the Kubernetes manifest in deploy/ and the tests check against this one list.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


def _env_int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected an integer") from None


def _lanes(name: str, value: str) -> int | None:
    return None if value == "auto" else _env_int(name, value)


def _api_keys(name: str, value: str) -> tuple[str, ...]:
    """Comma-separated keys. Set but holding none (empty, spaces, commas) is refused: read as no keys, it would
    turn the gate off without a word (security round 3, item 9)."""
    keys = tuple(item.strip() for item in value.split(",") if item.strip())
    if not keys:
        raise ValueError(f"{name} is set but holds no key; unset it to serve without keys, or give one or more")
    return keys


def _setting(name: str, default: Any, parse: Callable[[str, str], Any] | None = None, secret: bool = False) -> Any:
    """A field read from the environment variable `name`, else `default`; a secret is kept out of repr()."""

    def read() -> Any:
        value = os.environ.get(name)
        if value is None:
            return default
        return parse(name, value) if parse else value

    return field(default_factory=read, metadata={"env": name}, repr=not secret)


@dataclass(frozen=True)
class ServeConfig:
    model_dir: str | None = _setting("HANDOFF_MODEL_DIR", None)
    """An export folder; unset: the newest `model_name` model in the BentoML model store."""
    model_name: str = _setting("HANDOFF_MODEL_NAME", "handoff")
    model_sha256: str | None = _setting("HANDOFF_MODEL_SHA256", None)
    """sha256 of the export's manifest.json: pins the (unsigned) manifest, and through its hashes every artifact"""
    runtime: str = _setting("HANDOFF_RUNTIME", "onnx")
    """onnx | torchscript"""
    precision: str = _setting("HANDOFF_PRECISION", "fp32")
    """fp32 | int8 (the export's model.int8.onnx, only where it passed its accuracy gate)"""
    device: str = _setting("HANDOFF_DEVICE", "auto")
    """auto | cpu | cuda; cuda that cannot be had keeps the service not-ready"""
    tensorrt: str | None = _setting("HANDOFF_TENSORRT", None)
    """1: try ONNX Runtime's TensorRT provider before CUDA"""
    tensorrt_cache: str = _setting("HANDOFF_TRT_CACHE", os.path.expanduser("~/.cache/handoff/tensorrt"))
    """where TensorRT keeps its built engines (a folder only this service's user can write)"""
    api_keys: tuple[str, ...] = _setting("HANDOFF_API_KEYS", (), _api_keys, secret=True)
    """comma-separated bearer tokens; set: every endpoint but /livez, /readyz and the page needs one (401)"""
    show_paths: bool = _setting("HANDOFF_SHOW_PATHS", False, lambda name, value: value == "1")
    """1: /info shows absolute paths (checkpoint, model folder); otherwise file names only"""
    workers: int = _setting("HANDOFF_WORKERS", 1, _env_int)
    """server processes per replica: 1 on a CPU host for the lowest latency, one per core for the most images
    per second; one per GPU on a GPU host (docs/deploy.md, "Workers per replica")"""
    cpu_threads: int | None = _setting("HANDOFF_CPU_THREADS", None, _env_int)
    """threads each worker's model runs on; unset: the cores this process may use, shared out among the workers"""
    lanes: int | None = _setting("HANDOFF_LANES", None, _lanes)
    """batches each worker's model runs at once on a CPU, each on HANDOFF_CPU_THREADS / lanes threads; unset
    (auto): timed at load on a CPU with ONNX Runtime (serve/model/lanes.py), else 1"""
    max_batch_size: int = _setting("HANDOFF_MAX_BATCH_SIZE", 32, _env_int)
    """the largest batch; where lanes are timed at load, the batcher may stop at a smaller one that is as fast"""
    max_latency_ms: int = _setting("HANDOFF_MAX_LATENCY_MS", 10_000, _env_int)
    """the batcher's budget: a request it expects to wait longer, or that has waited longer, is refused with 503"""
    timeout_s: int = _setting("HANDOFF_TIMEOUT_S", 60, _env_int)
    """a request whose response has not started by then is cancelled and answered 504 (serve/http/deadline.py)"""
    max_concurrency: int = _setting("HANDOFF_MAX_CONCURRENCY", 256, _env_int)
    """requests in progress at once; more are answered 429 at once instead of queueing into timeouts"""
    body_timeout_s: int = _setting("HANDOFF_BODY_TIMEOUT_S", 10, _env_int)
    """an upload not complete by then gets 408: a stalled client holds a reading slot this long at most"""
    access_log: bool = _setting("HANDOFF_ACCESS_LOG", True, lambda name, value: value != "0")
    """0: no access-log line per request (serve/observability/access_log.py; BentoML's own is always off)"""
    max_connections: int = _setting("HANDOFF_MAX_CONNECTIONS", 1024, _env_int)
    """open connections per worker (kept under `ulimit -n`); past it the oldest idle one is closed for the new one"""
    header_timeout_s: int = _setting("HANDOFF_HEADER_TIMEOUT_S", 10, _env_int)
    """a request's headers must arrive within this of its first byte, or the connection is closed"""
    idle_timeout_s: int = _setting("HANDOFF_IDLE_TIMEOUT_S", 10, _env_int)
    """a new connection that sends nothing for this long is closed (kept-alive ones: HANDOFF_KEEP_ALIVE_S)"""
    max_header_kb: int = _setting("HANDOFF_MAX_HEADER_KB", 64, _env_int)
    """a request's line and headers together, in KiB; larger is answered 431 and the connection closed"""
    write_timeout_s: int = _setting("HANDOFF_WRITE_TIMEOUT_S", 30, _env_int)
    """a client that reads none of its answer for this long (its buffers full) has its connection closed"""
    keep_alive_s: int = _setting("HANDOFF_KEEP_ALIVE_S", 120, _env_int)
    """a kept-alive connection idle this long between requests is closed; longer than the idle timeout of any
    client or proxy in front (Go's and so KServe's queue-proxy 90 s, AWS ALB and nginx 60 s, httpx 5 s), so that
    the client, not the server, closes an idle connection: a server closing one races the client's next request"""
    max_body_mb: int = _setting("HANDOFF_MAX_BODY_MB", 20, _env_int)
    max_pixels: int = _setting("HANDOFF_MAX_PIXELS", 40_000_000, _env_int)
    """decompression-bomb guard: larger images are refused before decoding"""
    max_text_chars: int = _setting("HANDOFF_MAX_TEXT_CHARS", 100_000, _env_int)
    """a text classifier's longest text, in characters (413 past it); within it, texts past the model's maximum
    length are truncated to it and the answer says so"""
    max_audio_seconds: int = _setting("HANDOFF_MAX_AUDIO_SECONDS", 600, _env_int)
    """an audio file's longest duration, in seconds, declared by its header or decoded (413 past it)"""
    max_batch_tokens: int = _setting("HANDOFF_MAX_BATCH_TOKENS", 16_384, _env_int)
    """a text classifier's batch: at most this many tokens, each text padded to the longest in it"""
    max_generations: int = _setting("HANDOFF_MAX_GENERATIONS", 8, _env_int)
    """a language model's generations at once, each on its own thread; more are answered 429"""
    decode: str = _setting("HANDOFF_DECODE", "auto")
    """auto: a JPEG at least twice the resize target is decoded at a reduced scale (draft mode), where the
    export's check of that passed (manifest `decode`); exact: every image decoded bit-exactly"""

    def __post_init__(self) -> None:
        for name, value, least in (
            ("HANDOFF_MAX_BATCH_SIZE", self.max_batch_size, 2),
            ("HANDOFF_TIMEOUT_S", self.timeout_s, 1),
            ("HANDOFF_MAX_CONCURRENCY", self.max_concurrency, 1),
            ("HANDOFF_WORKERS", self.workers, 1),
            ("HANDOFF_BODY_TIMEOUT_S", self.body_timeout_s, 1),
            ("HANDOFF_MAX_CONNECTIONS", self.max_connections, 8),
            ("HANDOFF_HEADER_TIMEOUT_S", self.header_timeout_s, 1),
            ("HANDOFF_IDLE_TIMEOUT_S", self.idle_timeout_s, 1),
            ("HANDOFF_KEEP_ALIVE_S", self.keep_alive_s, 1),
            ("HANDOFF_MAX_HEADER_KB", self.max_header_kb, 8),
            ("HANDOFF_WRITE_TIMEOUT_S", self.write_timeout_s, 1),
            ("HANDOFF_MAX_TEXT_CHARS", self.max_text_chars, 1),
            ("HANDOFF_MAX_AUDIO_SECONDS", self.max_audio_seconds, 1),
            ("HANDOFF_MAX_GENERATIONS", self.max_generations, 1),
            ("HANDOFF_MAX_BATCH_TOKENS", self.max_batch_tokens, 1),
            ("HANDOFF_CPU_THREADS", self.model_threads(), 1),
            ("HANDOFF_LANES", 1 if self.lanes is None else self.lanes, 1),
        ):
            if value < least:
                raise ValueError(f"{name}={value}: must be at least {least}")
        if self.decode not in ("auto", "exact"):
            raise ValueError(f"HANDOFF_DECODE={self.decode!r}: choose auto or exact")
        if self.model_sha256 is not None and len(self.model_sha256) != 64:
            raise ValueError(
                f"HANDOFF_MODEL_SHA256={self.model_sha256!r}: expected 64 hex digits (sha256sum EXPORT/manifest.json)"
            )

    @property
    def max_body_bytes(self) -> int:
        return self.max_body_mb * 1024 * 1024

    @property
    def max_answer_numbers(self) -> int:
        """The most numbers any model's answer may hold: about a request body's limit as JSON (16 bytes each)."""
        return self.max_body_bytes // 16

    def cores_per_worker(self) -> int:
        """This worker's share of the cores: how many images it decodes at once, and its model's default threads
        (left to itself, each worker's runtime would start one thread per core: N workers, N x cores threads)."""
        return max(1, usable_cores() // self.workers)

    def model_threads(self) -> int:
        return self.cpu_threads if self.cpu_threads is not None else self.cores_per_worker()

    def batch_buckets(self) -> list[int]:
        """Batch sizes warmed up before ready: powers of two up to the batcher's maximum."""
        sizes, size = [], 1
        while size < self.max_batch_size:
            sizes.append(size)
            size *= 2
        return sizes + [self.max_batch_size]

    def locate_model(self) -> Path:
        if self.model_dir:
            return Path(self.model_dir)
        import bentoml

        return Path(bentoml.models.get(f"{self.model_name}:latest").path)


def usable_cores(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may use, not all the host has: its CPU set (`docker --cpuset-cpus`), capped by its
    CPU quota (`docker --cpus`, a Kubernetes CPU limit), rounded up. A runtime that starts a thread for each of
    a 64-core node's cores under a 2-core limit spends its time throttled."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = cpu_quota(cgroup)
    return max(1, min(cores, math.ceil(quota))) if quota else cores


def cpu_quota(cgroup: Path) -> float | None:
    """Cores' worth of CPU time the container may use (cgroup v2 cpu.max, else v1's CFS files); None: no limit."""
    v1 = cgroup / "cpu"
    for read in (
        lambda: (cgroup / "cpu.max").read_text().split()[:2],
        lambda: [(v1 / "cpu.cfs_quota_us").read_text(), (v1 / "cpu.cfs_period_us").read_text()],
    ):
        try:
            quota, period = (value.strip() for value in read())
            if quota in ("max", "-1"):
                return None
            return int(quota) / int(period)
        except (OSError, ValueError, ZeroDivisionError):
            continue
    return None


SETTINGS: tuple[str, ...] = tuple(f.metadata["env"] for f in fields(ServeConfig))
