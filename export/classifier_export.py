"""Write and prove an image classifier's export: ONNX, torch.export, TorchScript, safetensors (and INT8), each
checked against the eager model on real images."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from contract.manifest import (
    AOTI,
    ONNX,
    ONNX_INT8,
    PT2,
    SAFETENSORS,
    TORCHSCRIPT,
    describe_artifacts,
    embedded_fields,
    write_manifest,
)
from export.architecture import ModelSpec
from export.decode_check import check_fast_decode
from export.decode_check import report as decode_report
from export.exporters import (
    classifier_call,
    export_aoti,
    export_onnx,
    export_pt2,
    export_safetensors,
    export_torchscript,
)
from export.inputs import REAL_IMAGES, parity_inputs, real_images
from export.int8 import quantize, report_dict
from export.parity import DEFAULT_TOLERANCES, Tolerance, parity_report, pin_precision, run_parity
from export.steps import library_versions, timed

EXIT_OK, EXIT_PARITY, EXIT_UNCHECKED = 0, 3, 4
EXPORT_BATCH = 2


@dataclass(frozen=True)
class CheckOptions:
    """How the artifacts are checked (from the command line)."""

    fp16: bool
    tolerance: Tolerance
    samples: Path | None  # real images for parity and INT8 calibration, when the checkpoint names no data
    int8: bool
    max_accuracy_drop: float
    val_split: str | None = None  # the training script's name for its validation folder (timm's --val-split)


def tolerance_of(args: Any) -> Tolerance:
    default = DEFAULT_TOLERANCES["fp16" if args.fp16 else "fp32"]
    return Tolerance(
        args.atol if args.atol is not None else default.atol,
        args.rtol if args.rtol is not None else default.rtol,
        default.min_top1,
    )


def write_and_check(
    model: nn.Module,
    spec: ModelSpec,
    data: str | None,
    formats: list[str],
    device: torch.device,
    options: CheckOptions,
    manifest: dict[str, Any],
    folder: Path,
) -> int:
    """Write every artifact into `folder`, check each against the eager `model`, and complete the manifest.
    Returns the exit status: EXIT_OK, or EXIT_PARITY when parity or the INT8 gate failed."""
    pre = spec.preprocess
    example = torch.randn(EXPORT_BATCH, pre["channels"], pre["crop"], pre["crop"])
    artifact_model = copy.deepcopy(model).half() if options.fp16 else model  # the fp32 model stays the reference
    example_typed = classifier_call(example.half() if options.fp16 else example)
    exported: dict[str, dict] = {}
    timings = manifest["timings"]
    with torch.inference_mode(False), torch.no_grad():
        if "onnx" in formats:
            with timed(timings, "onnx"):
                exported["onnx"] = export_onnx(artifact_model, example_typed, folder / ONNX, embedded_fields(manifest))
        fields = {k: manifest[k] for k in manifest if k not in ("source", "timings")}
        if "pt2" in formats:
            with timed(timings, "pt2"):
                exported["pt2"] = export_pt2(artifact_model, example_typed, folder / PT2, fields)
        if "aoti" in formats:
            with timed(timings, "aoti"):
                exported["aoti"] = export_aoti(artifact_model, example_typed, folder / AOTI)
        if "torchscript" in formats:
            with timed(timings, "torchscript"):
                exported["torchscript"] = export_torchscript(
                    artifact_model, example_typed, folder / TORCHSCRIPT, fields
                )
        if "safetensors" in formats:
            with timed(timings, "safetensors"):
                exported["safetensors"] = export_safetensors(artifact_model, folder / SAFETENSORS, spec.arch)
    manifest["onnx"] = (
        {
            "opset": exported["onnx"]["opset"],
            "external_data": exported["onnx"]["external_data"],
            "input_name": "input",
            "output_name": "logits",
        }
        if "onnx" in exported
        else None
    )

    precision = pin_precision()
    tol = options.tolerance
    with timed(timings, "parity"):
        images, origin = real_images(data, options.samples, REAL_IMAGES, options.val_split)
        inputs, described = parity_inputs(pre, images, origin)
        computing = set(formats) - {"safetensors"}
        results, not_checked = (
            run_parity(model, folder, inputs, formats, device, options.fp16, tol) if computing else ([], None)
        )
    manifest["parity"] = parity_report(
        results, device, options.fp16, tol, precision, len(inputs), described, not_checked=not_checked
    )
    if manifest["parity"]["pass"]:
        with timed(timings, "decode_check"):
            check = check_fast_decode(model, pre, images)  # the same real images parity ran on
        manifest["decode"] = decode_report(check)
        manifest["parity"]["summary"].append(check.line())
    int8_passed = True
    if options.int8 and manifest["parity"]["pass"]:
        with timed(timings, "int8"):
            report = quantize(folder / ONNX, folder / ONNX_INT8, pre, data, options.samples, options.max_accuracy_drop)
        manifest["int8"] = {
            "artifact": ONNX_INT8,
            "method": "ONNX Runtime static quantization, QDQ, per-channel weights (S8), activations U8",
            **report_dict(report),
        }
        manifest["parity"]["summary"].append(report.line())
        exported["int8"] = {"files": [ONNX_INT8]}
        int8_passed = report.passed
    manifest["artifacts"] = describe_artifacts(folder, [f for e in exported.values() for f in e["files"]])
    manifest["versions"] = library_versions()
    status = settle(manifest)
    write_manifest(folder, manifest)
    return EXIT_PARITY if status == EXIT_OK and not int8_passed else status


def settle(manifest: dict[str, Any]) -> int:
    """The manifest's `status` from its parity verdict, and the exit status: passed, 0; failed, 3; not checked, 4
    when the reference gave nothing to compare, 0 when no computing format was asked for (--formats safetensors)."""
    report = manifest["parity"]
    manifest["status"] = {True: "passed", False: "failed", None: "not checked"}[report["pass"]]
    if report["pass"] is False:
        return EXIT_PARITY
    return EXIT_UNCHECKED if report["pass"] is None and report.get("not_checked") else EXIT_OK
