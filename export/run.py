"""The export itself, once the command line's options are checked (export/cli.py): read the checkpoint, rebuild
the model, write the artifacts into a staging folder, prove parity, and put the folder in place only whole."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from contract.manifest import ONNX_INT8, is_export_folder, new_manifest
from export import bento
from export.architecture import load_weights, resolve_model
from export.classifier_export import EXIT_OK, EXIT_UNCHECKED, CheckOptions, tolerance_of, write_and_check
from export.cli import CheckedOptions, bad_input
from export.compare import choose_checkpoint
from export.detection_export import detection_job, is_detector
from export.exporters import check_eval_mode
from export.hf_checkpoint import find_hf_checkpoint
from export.job import Job, log_loading, origin_fields
from export.out_folder import check_out, passed, replace_folder
from export.provenance import trace, whole_module
from export.segmentation_export import is_segmenter, segmentation_job
from export.sources import Source, read_source
from export.steps import timed
from export.tensor_export import tensor_job
from export.unwrap import LoadMismatch
from train.checkpoint import CheckpointError

log = logging.getLogger("export")


def _device(choice: str) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available here")
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def classifier_job(
    args: argparse.Namespace,
    checkpoint: Path,
    src: Source,
    checked: CheckedOptions,
    device: torch.device,
    timings: dict[str, float],
) -> Job:
    labels = checked.labels
    with timed(timings, "load"):
        spec = resolve_model(src, args.arch, args.model, args.image_size, labels)
        loads = src.module is None or args.arch or args.model  # else the pickled module is the model
        loaded, tied = load_weights(spec, src, not args.model, args.allow_partial) if loads else (set(), {})
        model = spec.model.float().eval()
        provenance = (
            trace(model, spec.unwrapped, loaded, tied, spec.arch, args.allow_partial)
            if loads
            else whole_module(model, spec.arch)
        )
    log_loading(src, spec.unwrapped)
    check_eval_mode(model)
    origin = origin_fields(checkpoint, src, spec.unwrapped, provenance)
    dtype = "float16" if args.fp16 else "float32"
    manifest = new_manifest(spec.arch, spec.classes, spec.preprocess, dtype, origin, timings)
    hints = src.preprocess_hints
    options = CheckOptions(
        args.fp16, tolerance_of(args), args.samples, args.int8, args.max_accuracy_drop, hints.get("val_split")
    )
    data = (src.meta or {}).get("data") or hints.get("data")  # handoff's meta, else the training script's args
    return Job(
        manifest,
        lambda folder: write_and_check(model, spec, data, checked.formats, device, options, manifest, folder),
        f"{spec.arch} ({spec.num_classes} classes)",
    )


def export(args: argparse.Namespace, checked: CheckedOptions) -> int:
    started = time.monotonic()
    timings: dict[str, float] = {}
    device = _device(args.device)
    checkpoint = choose_checkpoint(args.checkpoint, args.pick, args.trust_pickle, args.ema)
    hf = None if args.example or args.model or args.arch else find_hf_checkpoint(checkpoint, args.hf_config)
    if args.example is not None:
        job = tensor_job(args, checkpoint, checked.formats, device, timings)
    elif hf is not None:
        from export.text_export import text_job  # imports transformers: only a Hugging Face checkpoint's export

        job = text_job(args, hf, checked.formats, device, timings)
    else:
        with timed(timings, "read"):
            src = read_source(checkpoint, trust_pickle=args.trust_pickle, ema=args.ema)
        arch = args.arch or (None if args.model else src.arch)
        if is_detector(arch):
            job = detection_job(args, checkpoint, src, str(arch), device, timings, checked.labels)
        elif is_segmenter(arch):
            job = segmentation_job(args, checkpoint, src, str(arch), checked.formats, device, timings, checked.labels)
        else:
            job = classifier_job(args, checkpoint, src, checked, device, timings)
    manifest = job.manifest
    out = args.out or checkpoint.parent / f"{checkpoint.stem}.export"
    check_out(out, checkpoint)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp.", dir=out.parent))  # an unpredictable name
    os.chmod(staging, 0o755)  # mkdtemp's 0700 would hide the export from a service running as another user
    try:
        status = job.write(staging)
        if manifest["status"] != "passed" and is_export_folder(out) and passed(out):
            kept, out = out, out.with_name(out.name + ".failed")  # a good export survives a failed attempt
            log.warning(
                "this attempt failed its checks: %s keeps the previous, passing export; the attempt is in %s", kept, out
            )
            check_out(out, checkpoint)
        replace_folder(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return _report(args, job, out, status, time.monotonic() - started)


def _report(args: argparse.Namespace, job: Job, out: Path, status: int, seconds: float) -> int:
    """Print what was proven (provenance, then the parity table) and the verdict; register a passed export."""
    manifest = job.manifest
    report = [manifest["provenance"]["summary"], *manifest["parity"]["summary"]]
    if status == EXIT_UNCHECKED:
        print("\n".join(report), file=sys.stderr)
        print(
            f"export: parity NOT CHECKED: {manifest['parity']['not_checked']}; {out} is marked 'not checked', was not "
            "registered, and the service will not serve it"
            + ("" if args.accept_unchecked else " (exit 4; --accept-unchecked exits 0)"),
            file=sys.stderr,
        )
        return EXIT_OK if args.accept_unchecked else status
    if status != EXIT_OK:
        print("\n".join(report), file=sys.stderr)
        if manifest["parity"]["pass"]:
            print(
                f"export: the INT8 accuracy gate FAILED; {ONNX_INT8} in {out} is marked failed and will not be served; "
                "the export was not registered (rerun without --int8, or allow a larger --max-accuracy-drop)",
                file=sys.stderr,
            )
        else:
            print(
                f"export: parity FAILED; {out} is marked failed (manifest status) and was not registered",
                file=sys.stderr,
            )
        return status
    if manifest["status"] == "not checked":
        print(report[0])
        print(
            f"exported {manifest['arch']} weights to {out} in {seconds:.1f}s; parity NOT CHECKED (no format that "
            "computes: add onnx, torchscript or pt2 to --formats); not registered, and the service will not serve it"
        )
        return EXIT_OK
    tag = None if args.no_bento else bento.register(out, manifest, args.name)
    print("\n".join(report))
    print(
        f"exported {job.described} to {out} in {seconds:.1f}s; parity passed"
        + (f"; BentoML model {tag}" if tag else "")
    )
    return EXIT_OK


def run(args: argparse.Namespace, checked: CheckedOptions) -> int:
    """`python -m export` once its options passed export/cli.py's checks; returns the exit status."""
    # Our own progress at INFO; the exporter's internals (onnxscript passes) only when they warn.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    log.setLevel(logging.INFO)
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.jit")
    try:
        return export(args, checked)
    except (CheckpointError, LoadMismatch, ValueError, OSError) as err:
        return bad_input(err)
