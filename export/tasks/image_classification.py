"""An image classifier (handoff's own checkpoints, the ImageNet example's, torchvision's references, timm's): the
model rebuilt from its architecture and weights, written as ONNX, torch.export, TorchScript, safetensors (and
INT8), each checked against the eager model on real images. The task of every checkpoint no other task claims."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
from PIL import Image

from contract.manifest import (
    ONNX,
    ONNX_INT8,
    Manifest,
    new_manifest,
)
from contract.signature import TASK_IMAGE_CLASSIFICATION
from export.architecture import ModelSpec, load_weights, resolve_model
from export.decode_check import check_fast_decode
from export.decode_check import report as decode_report
from export.exporters import (
    check_eval_mode,
    classifier_call,
)
from export.image_processor import check_images
from export.inputs import REAL_IMAGES, parity_inputs, real_images
from export.int8 import quantize, report_dict
from export.job import Job, log_loading, origin_fields
from export.options import ExportOptions
from export.parity import Tolerance, parity_report, pin_precision, run_parity
from export.pipeline import (
    EXIT_OK,
    EXIT_PARITY,
    Check,
    ExportRequest,
    ExportTask,
    add_own_checks,
    close_manifest,
    library_checks,
    tolerance_of,
    write_formats,
)
from export.provenance import trace, whole_module
from export.steps import timed

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

    @classmethod
    def of(cls, options: ExportOptions, val_split: str | None = None) -> CheckOptions:
        """The command line's: --fp16, the tolerance, --samples, --int8 and --max-accuracy-drop."""
        parity = options.parity
        tolerance = tolerance_of(options)
        return cls(options.write.fp16, tolerance, parity.samples, parity.int8, parity.max_accuracy_drop, val_split)


def write_and_check(
    model: nn.Module,
    spec: ModelSpec,
    data: str | None,
    formats: list[str],
    device: torch.device,
    options: CheckOptions,
    manifest: Manifest,
    folder: Path,
    notes: tuple[str, ...] = (),
    reference: Callable[[list[Image.Image], Path], list[Check]] | None = None,
) -> int:
    """Write every artifact into `folder`, check each against the eager `model`, and complete the manifest; `notes`:
    the task's own checks, for the parity summary; `reference(images, folder)`: the written export against the
    user's library on parity's images (export/reference.py). Returns the exit status: EXIT_OK, or EXIT_PARITY when
    parity, the reference or the INT8 gate failed."""
    pre = spec.preprocess
    example = torch.randn(EXPORT_BATCH, pre["channels"], pre["crop"], pre["crop"])
    artifact_model = copy.deepcopy(model).half() if options.fp16 else model  # the fp32 model stays the reference
    example_typed = classifier_call(example.half() if options.fp16 else example)
    timings = manifest["timings"]
    exported, skipped = write_formats(artifact_model, example_typed, formats, folder, manifest, artifact_model)
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
        written = [name for name in formats if name in exported]
        computing = set(written) - {"safetensors"}
        results, not_checked = (
            run_parity(model, folder, inputs, written, device, options.fp16, tol) if computing else ([], None)
        )
    manifest["parity"] = parity_report(
        results, device, options.fp16, tol, precision, len(inputs), described, skipped, not_checked=not_checked
    )
    manifest["parity"]["summary"].extend(notes)
    if reference is not None and "onnx" in exported:
        with timed(timings, "reference"):
            checks = library_checks(lambda: reference(check_images(images), folder))
            add_own_checks(manifest["parity"], "reference", checks)
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
    status = close_manifest(manifest, folder, [f for e in exported.values() for f in e["files"]])
    return EXIT_PARITY if status == EXIT_OK and not int8_passed else status


def classifier_job(request: ExportRequest) -> Job:
    options, src = request.options, request.source
    with timed(request.timings, "load"):
        spec = resolve_model(
            src, options.read.arch, options.read.model, options.read.image_size, request.options.read.labels
        )
        loads = src.module is None or options.read.arch or options.read.model  # else the pickled module is the model
        loaded, tied = (
            load_weights(spec, src, not options.read.model, options.read.allow_partial) if loads else (set(), {})
        )
        model = spec.model.float().eval()
        provenance = (
            trace(model, spec.unwrapped, loaded, tied, spec.arch, options.read.allow_partial)
            if loads
            else whole_module(model, spec.arch)
        )
    log_loading(src, spec.unwrapped)
    check_eval_mode(model)
    origin = origin_fields(request.checkpoint, src, spec.unwrapped, provenance)
    dtype = "float16" if options.write.fp16 else "float32"
    manifest = new_manifest(spec.arch, spec.classes, spec.preprocess, dtype, origin, request.timings)
    hints = src.preprocess_hints
    checks = CheckOptions.of(options, hints.get("val_split"))
    data = (src.meta or {}).get("data") or hints.get("data")  # handoff's meta, else the training script's args
    formats, device = request.options.write.formats, request.device
    return Job(
        manifest,
        lambda folder: write_and_check(model, spec, data, formats, device, checks, manifest, folder),
        f"{spec.arch} ({spec.num_classes} classes)",
    )


TASK = ExportTask(
    TASK_IMAGE_CLASSIFICATION,
    "image classifiers",
    classifier_job,
    frozenset({"arch", "image_size", "labels", "model", "fp16", "int8", "max_accuracy_drop", "samples"}),
)
