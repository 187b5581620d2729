"""The export itself, once the command line's options are checked (export/cli.py): choose and read the checkpoint
(export/readers/), hand it to the task that recognizes it (export/tasks/), which rebuilds the model and writes and
proves the artifacts in a staging folder (export/pipeline.py), then put the folder in place only whole."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from contract.manifest import ONNX_INT8, is_export_folder
from export import bento
from export.cli import bad_input
from export.job import Job
from export.options import ExportOptions
from export.out_folder import check_out, passed, replace_folder
from export.pipeline import EXIT_OK, EXIT_UNCHECKED, ExportRequest
from export.readers.choose import choose_checkpoint
from export.tasks import task_for
from export.unwrap import LoadMismatch
from train.checkpoint import CheckpointError

log = logging.getLogger("export")


def _device(choice: str) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available here")
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def export(options: ExportOptions) -> int:
    """read -> task -> formats -> parity and provenance -> manifest -> place."""
    started = time.monotonic()
    device = _device(options.parity.device)
    checkpoint = choose_checkpoint(
        options.read.checkpoints, options.read.pick, options.read.trust_pickle, options.read.ema
    )
    request = ExportRequest(options, checkpoint, device, {})
    job = task_for(request).job(request)
    manifest = job.manifest
    out = options.write.out or checkpoint.parent / f"{checkpoint.stem}.export"
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
    return _report(options, job, out, status, time.monotonic() - started)


def _report(options: ExportOptions, job: Job, out: Path, status: int, seconds: float) -> int:
    """Print what was proven (provenance, then the parity table) and the verdict; register a passed export."""
    manifest = job.manifest
    report = [manifest["provenance"]["summary"], *manifest["parity"]["summary"]]
    if status == EXIT_UNCHECKED:
        print("\n".join(report), file=sys.stderr)
        print(
            f"export: parity NOT CHECKED: {manifest['parity']['not_checked']}; {out} is marked 'not checked', was not "
            "registered, and the service will not serve it"
            + ("" if options.parity.accept_unchecked else " (exit 4; --accept-unchecked exits 0)"),
            file=sys.stderr,
        )
        return EXIT_OK if options.parity.accept_unchecked else status
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
    tag = None if (not options.write.register) else bento.register(out, manifest, options.write.name)
    print("\n".join(report))
    print(
        f"exported {job.described} to {out} in {seconds:.1f}s; parity passed"
        + (f"; BentoML model {tag}" if tag else "")
    )
    return EXIT_OK


def run(options: ExportOptions) -> int:
    """`python -m export` once its options passed export/cli.py's checks; returns the exit status."""
    # Our own progress at INFO; the exporter's internals (onnxscript passes) only when they warn.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    log.setLevel(logging.INFO)
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.jit")
    try:
        return export(options)
    except (CheckpointError, LoadMismatch, ValueError, OSError) as err:
        return bad_input(err)
