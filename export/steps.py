"""Small helpers every export shares: timing a phase into the manifest, and the library versions it records."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch


def library_versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import torchvision

    return {
        "torch": str(torch.__version__),
        "torchvision": torchvision.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


@contextlib.contextmanager
def timed(timings: dict[str, float], name: str) -> Iterator[None]:
    started = time.monotonic()
    yield
    timings[name] = round(time.monotonic() - started, 3)
