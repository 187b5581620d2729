"""Export any model the user trained (`--model module:factory --example FILE`): build it, load the checkpoint's
weights, describe it by running the example, write ONNX, torch.export and TorchScript (where tracing works),
and prove each against the eager model on the example's rows (export/tensor_parity.py).

    python -m export ckpt.pth --model mypkg.models:TextClassifier --example example.pt --dynamic tokens:1
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from contract.manifest import (
    AOTI,
    ONNX,
    PT2,
    SAFETENSORS,
    TORCHSCRIPT,
    describe_artifacts,
    embedded_fields,
    new_tensor_manifest,
    write_manifest,
)
from export.architecture import build_user_model
from export.classifier_export import settle, tolerance_of
from export.exporters import (
    ExportCall,
    check_eval_mode,
    export_aoti,
    export_onnx,
    export_pt2,
    export_safetensors,
    export_torchscript,
)
from export.job import Job, log_loading, origin_fields
from export.parity import Comparison, Tolerance, parity_report, pin_precision
from export.sources import read_source
from export.steps import library_versions, timed
from export.tensor_model import (
    Example,
    SignatureModule,
    describe,
    dynamic_shapes,
    first_line,
    load_example,
    parse_dynamic,
    traceable,
)
from export.tensor_parity import run_tensor_parity

log = logging.getLogger("export")

# Flags that describe an image classifier: with --example they would be silently meaningless, so they are refused.
CLASSIFIER_ONLY = {
    "int8": "--int8",
    "fp16": "--fp16",
    "labels": "--labels",
    "arch": "--arch",
    "image_size": "--image-size",
    "samples": "--samples",
}


def refuse_classifier_flags(args: argparse.Namespace, what: str, allowed: tuple[str, ...] = ()) -> None:
    """One line naming the classifier-only flags given that `what` cannot take (`allowed`: those it can)."""
    given = [flag for attr, flag in CLASSIFIER_ONLY.items() if attr not in allowed and getattr(args, attr)]
    if given:
        raise ValueError(f"{', '.join(given)}: for image classifiers; {what} takes none")


def tensor_job(
    args: argparse.Namespace, checkpoint: Path, formats: list[str], device: torch.device, timings: dict[str, float]
) -> Job:
    refuse_classifier_flags(args, "a model exported with --example")
    if args.model is None:
        raise ValueError("--example describes your own model: add --model module:factory, which builds it")
    example = load_example(args.example)
    dynamic = parse_dynamic(args.dynamic, example)
    with timed(timings, "load"):
        src = read_source(checkpoint, trust_pickle=args.trust_pickle, ema=args.ema)
        model, unwrapped, provenance = build_user_model(src, args.model, args.allow_partial)
    check_eval_mode(model)
    signature, wrapped = describe(model, example, dynamic)
    log_loading(src, unwrapped)  # after the checks: a refused export prints its one line and nothing else
    dims = {name: list(d) for name, d in dynamic.items()}
    origin = origin_fields(checkpoint, src, unwrapped, provenance)
    manifest = new_tensor_manifest(args.model, signature, dims, origin, timings)
    tol = tolerance_of(args)
    ins = ", ".join(t.name for t in signature.inputs)
    outs = ", ".join(t.name for t in signature.outputs)
    return Job(
        manifest,
        lambda folder: write_tensor_export(wrapped, example, dynamic, formats, device, tol, manifest, folder),
        f"{args.model} (inputs {ins}; outputs {outs})",
    )


def _skip_formats_that_cannot_run(
    results: list[Comparison], exported: dict[str, dict], skipped: dict[str, str], folder: Path
) -> list[Comparison]:
    """A format other than ONNX whose runtime raised on a case is the format's limit, not the model's: skipped
    with the reason, its files removed from the export. ONNX's failures, and every numerical one, stay FAILs."""
    kept = []
    by_artifact = {files["files"][0]: name for name, files in exported.items() if files["files"]}
    for result in results:
        name = by_artifact.get(result.artifact)
        if result.passed or name in (None, "onnx") or " raised: " not in (result.reason or ""):
            kept.append(result)
            continue
        skipped[result.artifact] = f"cannot run every case: {result.reason}"
        for file in exported.pop(name)["files"]:
            (folder / file).unlink(missing_ok=True)
    return kept


def write_tensor_export(
    model: SignatureModule,
    example: Example,
    dynamic: dict[str, tuple[int, ...]],
    formats: list[str],
    device: torch.device,
    tol: Tolerance,
    manifest: dict[str, Any],
    folder: Path,
) -> int:
    """Write every format into `folder`, check each against the eager model, complete the manifest; the exit
    status. A model ONNX cannot take is ValueError (exit 2, nothing kept): ONNX is what the service runs. A format
    beside it that cannot be written, or that raises on a parity case (torch.export specialising a dimension the
    example declared dynamic), is skipped with its reason in the table and the manifest, its files removed; a
    numerical mismatch in any format fails the export."""
    call = ExportCall(
        tuple(traceable(example).inputs.values()),
        model.input_names,
        model.output_names,
        dynamic_shapes(example, dynamic),
    )
    fields = {k: manifest[k] for k in manifest if k not in ("source", "timings")}
    writers: dict[str, tuple[str, Callable[[], dict]]] = {
        "onnx": (ONNX, lambda: export_onnx(model, call, folder / ONNX, embedded_fields(manifest))),
        "pt2": (PT2, lambda: export_pt2(model, call, folder / PT2, fields)),
        "aoti": (AOTI, lambda: export_aoti(model, call, folder / AOTI)),
        "torchscript": (TORCHSCRIPT, lambda: export_torchscript(model, call, folder / TORCHSCRIPT, fields)),
        "safetensors": (SAFETENSORS, lambda: export_safetensors(model.model, folder / SAFETENSORS, manifest["arch"])),
    }
    exported: dict[str, dict] = {}
    skipped: dict[str, str] = {}
    with torch.inference_mode(False), torch.no_grad():
        for name in (f for f in writers if f in formats):
            artifact, write = writers[name]
            with timed(manifest["timings"], name):
                try:
                    exported[name] = write()
                except Exception as err:  # noqa: BLE001 - the exporter's own words, then what to try
                    if name == "onnx":
                        raise ValueError(
                            f"the model cannot be exported to onnx: {first_line(err)}; the service runs ONNX"
                        ) from None
                    tool = "torch.jit.trace" if name == "torchscript" else "torch.export"
                    skipped[artifact] = f"{tool} cannot export this model: {first_line(err)}"
    manifest["onnx"] = (
        {"opset": exported["onnx"]["opset"], "external_data": exported["onnx"]["external_data"]}
        if "onnx" in exported
        else None
    )
    precision = pin_precision()
    with timed(manifest["timings"], "parity"):
        results, cases, not_checked = run_tensor_parity(model, folder, example, dynamic, list(exported), device, tol)
    results = _skip_formats_that_cannot_run(results, exported, skipped, folder)
    manifest["parity"] = parity_report(
        results,
        device,
        False,
        tol,
        precision,
        example.rows,
        f"the example's own rows ({example.described()}): {'; '.join(cases)}",
        skipped=skipped,
        batch_sizes=sorted({1, 2, example.rows}),
        not_checked=not_checked,
    )
    manifest["artifacts"] = describe_artifacts(folder, [f for e in exported.values() for f in e["files"]])
    manifest["versions"] = library_versions()
    status = settle(manifest)
    write_manifest(folder, manifest)
    return status
