"""Let ONNX Runtime's CUDA provider find the CUDA and cuDNN libraries that pip installed.

onnxruntime-gpu looks for libcublasLt, libcudnn... on the loader's path only, so on a machine whose CUDA
libraries come as pip wheels (torch's nvidia-* packages) the CUDA provider fails to load and ONNX Runtime
falls back to the CPU with a log line. `onnxruntime.preload_dlls()` loads them from site-packages first.
Torch-free, so the service can use it.
"""

from __future__ import annotations

import os


def gpu_present() -> bool:
    """An NVIDIA driver is loaded (its control device exists): worth loading CUDA libraries for."""
    return os.path.exists("/dev/nvidiactl")


def preload_cuda_libraries() -> None:
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):  # onnxruntime-gpu >= 1.21
        ort.preload_dlls()
