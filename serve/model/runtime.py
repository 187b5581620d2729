"""Runtime backends: ONNX Runtime (default) and TorchScript (imports torch only when chosen).

Both take a float array N x C x H x W and return logits N x classes. Each is built from the bytes that
were checked against the manifest (never by reopening the file), and reports the provider and device it
really runs on: ONNX Runtime falls back to the CPU silently when CUDA cannot start, so the session's
providers are read back and a GPU that was asked for but not obtained is an error.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from contract.manifest import ONNX, ONNX_DATA, ONNX_INT8, TORCHSCRIPT, Manifest, read_artifact
from contract.ort_cuda import gpu_present, preload_cuda_libraries
from contract.signature import read_signature

log = logging.getLogger("bentoml.handoff.runtime")

RUNTIME_ARTIFACTS = {"onnx": ONNX, "torchscript": TORCHSCRIPT}  # the file each runtime loads at fp32
RUNTIMES = tuple(RUNTIME_ARTIFACTS)
PRECISIONS = ("fp32", "int8")
DEVICES = ("auto", "cpu", "cuda")


class RuntimeUnavailable(RuntimeError):
    """The runtime or device asked for cannot be had; the service stays not-ready and says why."""


class Runtime(Protocol):
    name: str
    provider: str
    device: str
    artifact: str  # the manifest-listed file it was built from (set by load_runtime)

    def __call__(self, batch: np.ndarray) -> np.ndarray: ...

    def run_named(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


def onnx_providers(device: str, tensorrt_cache: str | None = None) -> list[Any]:
    """ONNX Runtime's execution providers for `device`, in order of preference, with the settings the service
    uses (TF32 off, so results match the fp32 parity check). The benchmarks build their sessions with this
    too, so every side of a comparison runs on the same provider with the same settings."""
    wanted: list[Any] = []
    if device == "cuda" or (device == "auto" and gpu_present()):
        preload_cuda_libraries()
        if tensorrt_cache is not None:
            wanted.append(
                (
                    "TensorrtExecutionProvider",
                    {"trt_engine_cache_enable": True, "trt_engine_cache_path": tensorrt_cache},
                )
            )
        wanted.append(("CUDAExecutionProvider", {"use_tf32": 0}))
    wanted.append("CPUExecutionProvider")
    return wanted


def onnx_session_options(threads: int | None = None) -> Any:
    """The service's ONNX Runtime session settings (`threads`: the intra-op threads; None: one per core); the
    benchmarks' in-process limit and batched peer use them too, so a comparison differs in the serving stack only."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    # ONNX Runtime's idle intra-op threads spin by default, taking the cores the image decoders need
    # between batches; measured with `python -m bench serve_throughput` (docs/benchmarks.md).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


class OnnxRuntime:
    name = "onnx"
    artifact: str  # set by load_runtime: model.onnx or model.int8.onnx

    def __init__(
        self,
        model: bytes,
        external_data: bytes | None,
        device: str,
        dtype: str,
        tensorrt_cache: str | None = None,
        threads: int | None = None,
    ) -> None:
        import onnxruntime as ort

        options = onnx_session_options(threads)
        options.log_severity_level = 3  # the CPU fallback is detected below, not left to a log line
        if external_data is not None:  # weights beside the graph, handed over from memory like the graph
            options.add_external_initializers_from_files_in_memory([ONNX_DATA], [external_data], [len(external_data)])
        try:
            self.session = ort.InferenceSession(model, options, providers=onnx_providers(device, tensorrt_cache))
        except Exception as err:  # noqa: BLE001 - ONNX Runtime's own exception types (InvalidProtobuf, Fail...)
            raise RuntimeUnavailable(f"{ONNX}: ONNX Runtime cannot load it ({_first_line(err)})") from None
        self.provider = self.session.get_providers()[0]
        self.device = "cpu" if self.provider == "CPUExecutionProvider" else "cuda"
        if device == "cuda" and self.device != "cuda":
            raise RuntimeUnavailable(
                f"HANDOFF_DEVICE=cuda but ONNX Runtime runs on {self.provider} "
                f"(available: {', '.join(ort.get_available_providers())}; is a GPU visible?)"
            )
        self.dtype = np.float16 if dtype == "float16" else np.float32
        self.input_name = self.session.get_inputs()[0].name

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        logits = self.session.run(None, {self.input_name: batch.astype(self.dtype, copy=False)})[0]
        return logits.astype(np.float32, copy=False)

    def run_named(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Any model: its inputs by name -> its outputs by name (an input the graph does not use is dropped)."""
        feed = {i.name: inputs[i.name] for i in self.session.get_inputs()}
        names = [o.name for o in self.session.get_outputs()]
        return dict(zip(names, self.session.run(None, feed), strict=True))


class TorchScriptRuntime:
    name = "torchscript"
    artifact: str  # set by load_runtime

    def __init__(self, model: bytes, manifest: Manifest, device: str, dtype: str, threads: int | None = None) -> None:
        try:
            import torch
        except ImportError:
            raise RuntimeUnavailable(
                "HANDOFF_RUNTIME=torchscript needs torch, which this environment does not have "
                "(a Bento serves ONNX without it); use HANDOFF_RUNTIME=onnx"
            ) from None

        has_cuda = torch.cuda.is_available()
        if device == "cuda" and not has_cuda:
            raise RuntimeUnavailable("HANDOFF_DEVICE=cuda but torch sees no CUDA device")
        if threads is not None:
            torch.set_num_threads(threads)
        self.torch = torch
        self.torch_device = torch.device("cuda" if device in ("auto", "cuda") and has_cuda else "cpu")
        try:
            self.module = torch.jit.load(io.BytesIO(model), map_location=self.torch_device).eval()
        except RuntimeError as err:
            raise RuntimeUnavailable(f"{TORCHSCRIPT}: torch cannot load it ({_first_line(err)})") from None
        self.provider, self.device = "torch", self.torch_device.type
        self.dtype = torch.float16 if dtype == "float16" else torch.float32
        signature = read_signature(manifest)
        self.inputs = [t.name for t in signature.inputs]
        self.outputs = [t.name for t in signature.outputs]

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        with self.torch.inference_mode():
            inputs = self.torch.from_numpy(batch).to(self.torch_device, self.dtype)
            return self.module(inputs).float().cpu().numpy()

    def run_named(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Any model: the inputs in the signature's order, the outputs (a tuple, as exported) by its names."""
        with self.torch.inference_mode():
            tensors = [self.torch.from_numpy(np.ascontiguousarray(inputs[n])) for n in self.inputs]
            outputs = self.module(*(t.to(self.torch_device) for t in tensors))
        return {n: t.cpu().numpy() for n, t in zip(self.outputs, outputs, strict=True)}


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return (text.splitlines()[-1] if text else type(err).__name__)[:200]


def runtime_artifact(kind: str, precision: str, manifest: Manifest) -> str:
    """The file to serve for this runtime and precision; INT8 only where it passed its accuracy gate."""
    if kind not in RUNTIMES:
        raise RuntimeUnavailable(f"HANDOFF_RUNTIME={kind!r}: choose one of {', '.join(RUNTIMES)}")
    if precision not in PRECISIONS:
        raise RuntimeUnavailable(f"HANDOFF_PRECISION={precision!r}: choose one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return RUNTIME_ARTIFACTS[kind]
    int8 = manifest.get("int8")
    if kind != "onnx":
        raise RuntimeUnavailable("HANDOFF_PRECISION=int8 is served by ONNX Runtime only: use HANDOFF_RUNTIME=onnx")
    if not int8:
        raise RuntimeUnavailable("HANDOFF_PRECISION=int8 but this export has no INT8 artifact (export with --int8)")
    if not int8.get("passed"):
        raise RuntimeUnavailable(
            f"HANDOFF_PRECISION=int8 but {ONNX_INT8} failed its accuracy gate "
            f"(drop {int8.get('drop')} points, allowed {int8.get('max_drop')})"
        )
    return ONNX_INT8


def load_runtime(
    kind: str,
    folder: Path,
    manifest: Manifest,
    device: str,
    precision: str = "fp32",
    tensorrt_cache: str | None = None,
    threads: int | None = None,
) -> Runtime:
    """The runtime `kind` on `device` at `precision`, built from the manifest-verified bytes of its artifact;
    `tensorrt_cache` set: ONNX Runtime tries TensorRT first, keeping its engines there; `threads`: the CPU
    threads the model runs on (None: the runtime's default, one per core)."""
    if device not in DEVICES:
        raise RuntimeUnavailable(f"HANDOFF_DEVICE={device!r}: choose one of {', '.join(DEVICES)}")
    artifact = runtime_artifact(kind, precision, manifest)
    model = read_artifact(folder, manifest, artifact)
    dtype = manifest.get("input", {}).get("dtype", "float32")  # a classifier's artifacts may be float16
    runtime: Runtime
    if kind == "onnx":
        external = (manifest.get("onnx") or {}).get("external_data") and artifact == ONNX
        runtime = OnnxRuntime(
            model,
            read_artifact(folder, manifest, ONNX_DATA) if external else None,
            device,
            dtype,
            tensorrt_cache,
            threads,
        )
    else:
        runtime = TorchScriptRuntime(model, manifest, device, dtype, threads)
    runtime.artifact = artifact
    log.info("runtime %s on %s (%s)", runtime.name, runtime.device, runtime.provider)
    return runtime


def best_first(scores: np.ndarray) -> np.ndarray:
    """Each row's class indices, best score first; equal scores in index order, as argmax and the eager model's
    top-1 break them (INT8 outputs are quantized, so exact ties happen: an unstable sort answered 6 where
    argmax said 5)."""
    return np.argsort(-scores, axis=1, kind="stable")
