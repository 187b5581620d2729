"""Service settings, read once from the environment (so `bentoml serve` needs no extra flags)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected an integer") from None


@dataclass(frozen=True)
class ServeConfig:
    model_dir: str | None = field(default_factory=lambda: os.environ.get("HANDOFF_MODEL_DIR"))
    """An export folder; unset: the newest `model_name` model in the BentoML model store."""
    model_name: str = field(default_factory=lambda: os.environ.get("HANDOFF_MODEL_NAME", "handoff"))
    runtime: str = field(default_factory=lambda: os.environ.get("HANDOFF_RUNTIME", "onnx"))
    """onnx | torchscript"""
    device: str = field(default_factory=lambda: os.environ.get("HANDOFF_DEVICE", "auto"))
    """auto | cpu | cuda; cuda that cannot be had keeps the service not-ready"""
    max_batch_size: int = field(default_factory=lambda: _env_int("HANDOFF_MAX_BATCH_SIZE", 32))
    max_latency_ms: int = field(default_factory=lambda: _env_int("HANDOFF_MAX_LATENCY_MS", 10_000))
    """BentoML's batching budget: requests it expects to wait longer are refused with 503, so keep it generous"""
    timeout_s: int = field(default_factory=lambda: _env_int("HANDOFF_TIMEOUT_S", 60))
    """a request not answered by then gets 504; BentoML keeps each request's context this long (~4 KB)"""
    max_concurrency: int = field(default_factory=lambda: _env_int("HANDOFF_MAX_CONCURRENCY", 256))
    """requests in progress at once; more are answered 429 at once instead of queueing into timeouts"""
    max_body_bytes: int = field(default_factory=lambda: _env_int("HANDOFF_MAX_BODY_MB", 20) * 1024 * 1024)
    max_pixels: int = field(default_factory=lambda: _env_int("HANDOFF_MAX_PIXELS", 40_000_000))
    """decompression-bomb guard: larger images are refused before decoding"""

    def __post_init__(self) -> None:
        if self.max_batch_size < 2:
            raise ValueError(f"HANDOFF_MAX_BATCH_SIZE={self.max_batch_size}: must be at least 2")
        if self.timeout_s < 1:
            raise ValueError(f"HANDOFF_TIMEOUT_S={self.timeout_s}: must be at least 1")
        if self.max_concurrency < 1:
            raise ValueError(f"HANDOFF_MAX_CONCURRENCY={self.max_concurrency}: must be at least 1")

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
