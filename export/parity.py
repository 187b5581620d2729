"""Prove the artifacts compute what the eager model computes, on the same inputs.

Reference: the eager model on the GPU where there is one (else the CPU), fp32 with TF32 off.
Compared: ONNX Runtime on the CPU provider, and on the CUDA provider where present (checked with
`get_providers()`, since ONNX Runtime falls back to the CPU silently), and TorchScript.
Inputs: real images through the model's own preprocessing plus random ones, in batches of 1, the
export batch and a larger one, so the dynamic batch axis is exercised.

An artifact passes when every output satisfies |a - b| <= atol + rtol * max|b| over its row (`close_by_row`)
and its top-1 agrees with the reference on at least `min_top1` of the inputs. The scale is the row's, not each
element's: a diverged model (the ImageNet example run at its default learning rate on a small batch) reaches
logits of 1.3e7, where float32 rounding alone moves a logit of 10.5 by 16; an element-wise rule failed that
faithful export, while a perturbed weight still fails this one (tests/unit/test_parity_rule.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from contract.manifest import AOTI, ONNX, PT2, TORCHSCRIPT
from contract.ort_cuda import preload_cuda_libraries

log = logging.getLogger(__name__)

BATCH_SIZES = (1, 2, 8)  # 2 is the export batch


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    min_top1: float  # fraction of inputs whose arg-max must agree


# fp32: kernels differ in summation order only; fp16: 10-bit mantissas and a few near-ties in top-1.
DEFAULT_TOLERANCES = {"fp32": Tolerance(1e-4, 1e-3, 1.0), "fp16": Tolerance(5e-2, 5e-2, 0.97)}


@dataclass
class Comparison:
    artifact: str
    runtime: str
    provider: str
    device: str
    max_abs_error: float
    max_rel_error: float  # max |a - b| / max |b|: relative to the logits' scale
    top1_agreement: float | None  # None for a model that is not a classifier
    passed: bool
    reason: str | None = None  # why it failed, in a line: the runtime's error, NaN, a shape, the tolerance


def pin_precision() -> dict[str, Any]:
    """TF32 off on the PyTorch side (ONNX Runtime's CUDA side gets use_tf32=0 per session)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return {"tf32": False, "cudnn_allow_tf32": False, "matmul_allow_tf32": False, "ort_cuda_use_tf32": 0}


def close_by_row(reference: np.ndarray, other: np.ndarray, tol: Tolerance) -> tuple[float, float, bool]:
    """(max abs error, max error relative to the output's scale, pass) for one output: floats within
    atol + rtol x max|reference| over each row (dimension 0), integers and booleans exactly equal."""
    if reference.shape != other.shape:
        return float("inf"), float("inf"), False
    if reference.dtype.kind in "biu":
        wrong = int(np.count_nonzero(reference != other))
        return float(wrong), float(wrong), wrong == 0
    ref = reference.astype(np.float64)
    diff = np.abs(other.astype(np.float64) - ref)
    if not ref.size:
        return 0.0, 0.0, True
    scale = np.abs(ref).reshape(len(ref), -1).max(axis=1).reshape((-1,) + (1,) * (ref.ndim - 1))
    max_abs = float(diff.max())
    max_rel = max_abs / max(float(np.abs(ref).max()), 1e-12)
    return max_abs, max_rel, bool(np.all(diff <= tol.atol + tol.rtol * scale))


def _compare(reference: np.ndarray, other: np.ndarray, tol: Tolerance) -> tuple[float, float, float, bool]:
    max_abs, max_rel, close = close_by_row(reference, other, tol)
    top1 = float((other.argmax(1) == reference.argmax(1)).mean())
    return max_abs, max_rel, top1, close and top1 >= tol.min_top1


def _batches(inputs: torch.Tensor) -> list[torch.Tensor]:
    return [inputs[i : i + b] for b in BATCH_SIZES for i in range(0, len(inputs) - b + 1, b)]


def onnx_sessions(path: Path, device: torch.device) -> list[tuple[str, str, Any]]:
    """(provider, device type, session) for every ONNX Runtime provider parity checks: the CPU's, and CUDA's
    where the reference runs on a GPU."""
    providers = ["CPUExecutionProvider"] + (["CUDAExecutionProvider"] if device.type == "cuda" else [])
    return [
        (p, "cuda" if p == "CUDAExecutionProvider" else "cpu", _onnx_session(path, p, device.index or 0))
        for p in providers
    ]


def _onnx_session(path: Path, provider: str, device_index: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    providers: list[Any] = ["CPUExecutionProvider"]
    if provider == "CUDAExecutionProvider":
        preload_cuda_libraries()
        providers = [("CUDAExecutionProvider", {"device_id": device_index, "use_tf32": 0}), "CPUExecutionProvider"]
    session = ort.InferenceSession(str(path), options, providers=providers)
    active = session.get_providers()[0]
    if active != provider:
        raise RuntimeError(f"ONNX Runtime was asked for {provider} but runs on {active}")
    return session


def _onnx_runner(session: Any, dtype: torch.dtype) -> Callable[[torch.Tensor], np.ndarray]:
    return lambda batch: session.run(None, {"input": batch.to(dtype).numpy()})[0]


def _load_aoti(path: str) -> Callable[[torch.Tensor], torch.Tensor]:
    return torch._inductor.aoti_load_package(path)


def run_parity(
    model: nn.Module,
    folder: Path,
    inputs: torch.Tensor,
    formats: list[str],
    device: torch.device,
    fp16: bool,
    tol: Tolerance,
) -> tuple[list[Comparison], str | None]:
    """Compare every artifact in `folder` with the eager fp32 `model` on `device`; and why that compared
    nothing (`uninformative`), or None."""
    model = model.float().to(device).eval()
    batches = _batches(inputs)
    with torch.inference_mode():
        reference = [model(b.to(device)).float().cpu().numpy() for b in batches]
    # every input is among the batches (those of 1 row): their outputs, as they are, tell whether any moved
    not_checked = uninformative([np.concatenate(reference)], [torch.cat(batches).numpy()])
    feed_dtype = torch.float16 if fp16 else torch.float32
    runners: list[tuple[str, str, str, str, Callable[[torch.Tensor], np.ndarray]]] = []
    if "onnx" in formats:
        for provider, dev, session in onnx_sessions(folder / ONNX, device):
            runners.append((ONNX, "onnxruntime", provider, dev, _onnx_runner(session, feed_dtype)))
    for name, artifact, runtime, load in (
        ("pt2", PT2, "torch.export", lambda p: torch.export.load(p).module()),
        ("aoti", AOTI, "aotinductor", _load_aoti),
    ):
        if name in formats:
            loaded = load(str(folder / artifact))
            # The AOTI package is compiled for the CPU here; the ExportedProgram runs where the reference does.
            where = device if name == "pt2" else torch.device("cpu")
            if name == "pt2":
                loaded = loaded.to(where)  # type: ignore[union-attr]

            def run_loaded(b: torch.Tensor, m=loaded, where=where) -> np.ndarray:
                with torch.inference_mode():
                    return m(b.to(where, feed_dtype)).float().cpu().numpy()

            runners.append((artifact, runtime, "torch", where.type, run_loaded))
    if "torchscript" in formats:
        scripted = torch.jit.load(str(folder / TORCHSCRIPT), map_location=device).eval()

        def run_ts(b: torch.Tensor) -> np.ndarray:
            with torch.inference_mode():
                return scripted(b.to(device, feed_dtype)).float().cpu().numpy()

        runners.append((TORCHSCRIPT, "torchscript", "torch", device.type, run_ts))

    results = []
    for artifact, runtime, provider, dev, run in runners:
        outputs = [run(b) for b in batches]
        max_abs, max_rel, top1, passed = _compare(np.concatenate(reference), np.concatenate(outputs), tol)
        results.append(Comparison(artifact, runtime, provider, dev, max_abs, max_rel, top1, passed))
        log.debug(
            "parity %-22s %-22s max abs %.2e  max rel %.2e  top-1 %.1f%%  %s",
            artifact,
            provider,
            max_abs,
            max_rel,
            100 * top1,
            "pass" if passed else "FAIL",
        )
    return results, not_checked


def summary_table(
    results: list[Comparison], device: torch.device, fp16: bool, tol: Tolerance, num_inputs: int
) -> list[str]:
    """The parity result as a few lines a person reads at a glance (printed, and kept in the manifest)."""
    classifier = any(r.top1_agreement is not None for r in results)
    top1 = f" and top-1 >= {100 * tol.min_top1:g}%" if classifier else "; integers and booleans exactly"
    lines = [
        f"parity against the eager model on {device} ({'fp16 artifacts' if fp16 else 'fp32, TF32 off'}; "
        f"{num_inputs} inputs; pass: |diff| <= {tol.atol:g} + {tol.rtol:g} x max|ref| of the row{top1})",
        f"  {'artifact':<22} {'runtime / provider':<34} {'max abs':>9} {'max rel':>9} {'top-1':>7}  result",
    ]
    for r in results:
        top1 = "-" if r.top1_agreement is None else f"{100 * r.top1_agreement:.1f}%"
        lines.append(
            f"  {r.artifact:<22} {r.runtime + ' / ' + r.provider:<34} {r.max_abs_error:9.2e} "
            f"{r.max_rel_error:9.2e} {top1:>7}  {'pass' if r.passed else 'FAIL: ' + (r.reason or 'outside tolerance')}"
        )
    if not results:
        lines.append("  (no computing artifact: nothing to compare)")
    return lines


def parity_report(
    results: list[Comparison],
    device: torch.device,
    fp16: bool,
    tol: Tolerance,
    precision: dict[str, Any],
    num_inputs: int,
    inputs_described: str,
    skipped: dict[str, str] | None = None,
    batch_sizes: list[int] | None = None,
    not_checked: str | None = None,
) -> dict[str, Any]:
    """The manifest's `parity` block. With no computing artifact (safetensors only), or a reference that gave
    nothing to compare (`not_checked`: why, from `uninformative`), `pass` is None ("not checked"), never True, even
    where every artifact agreed. `skipped`: formats that could not be written, and why."""
    summary = summary_table(results, device, fp16, tol, num_inputs)
    summary += [f"  {name:<22} skipped: {reason}" for name, reason in (skipped or {}).items()]
    passed = all(r.passed for r in results) if results else None
    if not_checked is not None and passed is not False:
        summary.append(f"  NOT CHECKED: {not_checked}")
        passed = None
    return {
        "summary": summary,
        "device": str(device),
        "precision": {"policy": "fp16 artifacts vs fp32 eager" if fp16 else "fp32", **precision},
        "tolerance": asdict(tol),
        "batch_sizes": batch_sizes or list(BATCH_SIZES),
        "inputs": num_inputs,
        "inputs_described": inputs_described,
        "results": [asdict(r) for r in results],
        "skipped": skipped or {},
        "not_checked": not_checked,
        "pass": passed,
    }


def uninformative(outputs: list[np.ndarray], inputs: list[np.ndarray]) -> str | None:
    """Why parity over these reference outputs compared nothing, or None: every output (dimension 0: one row per
    input) the same for inputs that differ, so an artifact that ignored its input would pass. A weak model whose
    numbers move with its input is compared: this asks only that they move."""

    def alike(array: np.ndarray) -> bool:
        if len(array) < 2:
            return True
        if array.dtype.kind == "f":
            return bool(np.allclose(array, array[:1], rtol=1e-6, atol=1e-7, equal_nan=True))
        return bool(np.array_equal(array, np.broadcast_to(array[:1], array.shape)))

    if not outputs or any(len(i) < 2 for i in inputs) or all(alike(i) for i in inputs):
        return None  # one input, or inputs all alike: nothing to tell
    if all(alike(o) for o in outputs):
        rows = len(outputs[0])
        return (
            f"the eager model gives the same output for all {rows} inputs (a model that learned nothing, or weights "
            "that were zeroed): parity cannot tell a faithful artifact from one that ignores its input"
        )
    return None
