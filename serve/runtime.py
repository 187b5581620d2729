"""Runtime backends: ONNX Runtime (default) and TorchScript (imports torch only when chosen).

Both take a float array N x C x H x W and return logits N x classes. Each reports the provider and
device it really runs on: ONNX Runtime falls back to the CPU silently when CUDA cannot start, so
the session's providers are read back and a GPU that was asked for but not obtained is an error.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from export.manifest import ONNX, TORCHSCRIPT
from export.ort_cuda import gpu_present, preload_cuda_libraries

log = logging.getLogger("bentoml.handoff.runtime")

RUNTIME_ARTIFACTS = {"onnx": ONNX, "torchscript": TORCHSCRIPT}  # the file each runtime loads
RUNTIMES = tuple(RUNTIME_ARTIFACTS)
DEVICES = ("auto", "cpu", "cuda")


class RuntimeUnavailable(RuntimeError):
    """The runtime or device asked for cannot be had; the service stays not-ready and says why."""


class Runtime(Protocol):
    name: str
    provider: str
    device: str

    def __call__(self, batch: np.ndarray) -> np.ndarray: ...


class OnnxRuntime:
    name = "onnx"

    def __init__(self, folder: Path, device: str, dtype: str) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3  # the CPU fallback is detected below, not left to a log line
        # ONNX Runtime's idle intra-op threads spin by default, taking the cores the image decoders need
        # between batches; measured with bench/serve_throughput.py (see BENCHMARKS.md).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        wanted: list[Any] = []
        if device == "cuda" or (device == "auto" and gpu_present()):
            preload_cuda_libraries()
        if device in ("auto", "cuda"):
            if os.environ.get("HANDOFF_TENSORRT") == "1":
                cache = os.environ.get("HANDOFF_TRT_CACHE", str(folder / ".trt-cache"))
                wanted.append(("TensorrtExecutionProvider", {"trt_engine_cache_enable": True,
                                                             "trt_engine_cache_path": cache}))
            wanted.append(("CUDAExecutionProvider", {"use_tf32": 0}))
        wanted.append("CPUExecutionProvider")
        self.session = ort.InferenceSession(str(folder / RUNTIME_ARTIFACTS[self.name]), options, providers=wanted)
        self.provider = self.session.get_providers()[0]
        self.device = "cpu" if self.provider == "CPUExecutionProvider" else "cuda"
        if device == "cuda" and self.device != "cuda":
            raise RuntimeUnavailable(f"HANDOFF_DEVICE=cuda but ONNX Runtime runs on {self.provider} "
                                     f"(available: {', '.join(ort.get_available_providers())}; is a GPU visible?)")
        self.dtype = np.float16 if dtype == "float16" else np.float32
        self.input_name = self.session.get_inputs()[0].name

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        logits = self.session.run(None, {self.input_name: batch.astype(self.dtype, copy=False)})[0]
        return logits.astype(np.float32, copy=False)


class TorchScriptRuntime:
    name = "torchscript"

    def __init__(self, folder: Path, device: str, dtype: str) -> None:
        import torch

        has_cuda = torch.cuda.is_available()
        if device == "cuda" and not has_cuda:
            raise RuntimeUnavailable("HANDOFF_DEVICE=cuda but torch sees no CUDA device")
        self.torch = torch
        self.torch_device = torch.device("cuda" if device in ("auto", "cuda") and has_cuda else "cpu")
        self.module = torch.jit.load(str(folder / RUNTIME_ARTIFACTS[self.name]), map_location=self.torch_device).eval()
        self.provider, self.device = "torch", self.torch_device.type
        self.dtype = torch.float16 if dtype == "float16" else torch.float32

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        with self.torch.inference_mode():
            inputs = self.torch.from_numpy(batch).to(self.torch_device, self.dtype)
            return self.module(inputs).float().cpu().numpy()


def load_runtime(kind: str, folder: Path, device: str, dtype: str) -> Runtime:
    if kind not in RUNTIMES:
        raise RuntimeUnavailable(f"HANDOFF_RUNTIME={kind!r}: choose one of {', '.join(RUNTIMES)}")
    if device not in DEVICES:
        raise RuntimeUnavailable(f"HANDOFF_DEVICE={device!r}: choose one of {', '.join(DEVICES)}")
    runtime: Runtime = (OnnxRuntime if kind == "onnx" else TorchScriptRuntime)(folder, device, dtype)
    log.info("runtime %s on %s (%s)", runtime.name, runtime.device, runtime.provider)
    return runtime


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)
