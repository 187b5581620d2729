"""Export a checkpoint to ONNX, torch.export (pt2), TorchScript and safetensors, and prove numerical parity.

    python -m export runs/demo/last.pt                       # a handoff checkpoint: no flags needed
    python -m export model_best.pth.tar                      # the ImageNet example's checkpoint (arch inside)
    python -m export output/model_29.pth --ema               # torchvision's references, their EMA weights
    python -m export output/train/*/model_best.pth.tar       # timm's train.py (timm's preprocessing)
    python -m export outputs/checkpoint/step-1000            # torch.distributed.checkpoint (FSDP2, torchtitan)
    python -m export weights.pth --arch resnet50             # a bare state_dict, DDP-prefixed or not
    python -m export weights.pth --arch timm/convnext_atto   # the same, of a timm model
    python -m export model.pt --trust-pickle                 # a whole pickled nn.Module (only if you trust it)

Exit status: 0 exported and parity passed; 2 bad input or usage (one line on stderr, nothing written);
3 parity failed (report printed, folder written with status "failed", never registered).
"""

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

from export import bento
from export.architecture import load_weights, resolve_model
from export.classifier_export import EXIT_OK, CheckOptions, tolerance_of, write_and_check
from export.compare import choose_checkpoint
from export.exporters import check_eval_mode
from export.job import Job, log_loading, source_fields
from export.manifest import DEFAULT_FORMATS, FORMATS, ONNX_INT8, is_export_folder, new_manifest
from export.out_folder import check_out, passed, replace_folder
from export.sources import read_source
from export.steps import timed
from export.tensor_export import tensor_job
from export.unwrap import LoadMismatch
from train.checkpoint import CheckpointError
from train.class_names import check_class_names
from train.data import check_image_size

log = logging.getLogger("export")

EXIT_BAD_INPUT = 2  # EXIT_OK (0) and EXIT_PARITY (3) come with the writers


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m export",
        description=__doc__.split("\n\n")[0],
        epilog="examples:\n" + __doc__.split("\n\n")[1] + "\n\n" + __doc__.split("\n\n")[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    read = p.add_argument_group("what to read")
    read.add_argument(
        "checkpoint",
        type=Path,
        nargs="+",
        help="a .pt/.pth/.pth.tar/.ckpt/.bin/.safetensors file, or a folder: "
        "torch.distributed.checkpoint (FSDP2, torchtitan step-N) or Accelerate save_state; several (one per "
        "node, say) are compared tensor by tensor first: identical, the first is exported; different, exit 2",
    )
    read.add_argument(
        "--pick",
        type=int,
        default=None,
        help="with several checkpoints that differ: export the Nth (1-based) anyway (default: refuse)",
    )
    read.add_argument(
        "--arch",
        default=None,
        help="when the checkpoint does not name one: a torchvision classifier "
        "(resnet50), or timm/NAME for a timm model; a bare name always means torchvision's, also where "
        "timm has the same name (a timm checkpoint's own arch is read as timm's)",
    )
    read.add_argument(
        "--ema",
        action="store_true",
        help="export the EMA weights (torchvision's model_ema, timm's "
        "state_dict_ema, any *ema* state) instead of the trained ones (default: trained)",
    )
    read.add_argument(
        "--model",
        default=None,
        help="module:factory that builds your own nn.Module (called with num_classes= when it takes it)",
    )
    read.add_argument(
        "--example",
        type=Path,
        default=None,
        help="any model (with --model): a .pt (weights_only) or .npz holding one tensor or a dict of named "
        "tensors: the inputs' names, dtypes and shapes, and the values parity runs on; dimension 0 is the batch",
    )
    read.add_argument(
        "--dynamic",
        action="append",
        default=[],
        metavar="NAME:DIM[,DIM]",
        help="with --example: more dynamic dimensions of input NAME besides the batch, e.g. tokens:1 for a "
        "sequence length (repeatable, once per input)",
    )
    read.add_argument(
        "--image-size", type=int, default=None, help="input side, when the checkpoint does not say (default: 224)"
    )
    read.add_argument(
        "--labels",
        type=Path,
        default=None,
        help="class names, one per line, in index order (default: the checkpoint's, else 0..N-1)",
    )
    read.add_argument(
        "--trust-pickle",
        action="store_true",
        help="allow full unpickling; this runs code from the "
        "file, so only for files you trust (default: off, weights_only=True)",
    )
    write = p.add_argument_group("what to write")
    write.add_argument(
        "--out",
        type=Path,
        default=None,
        help="export folder (default: beside the checkpoint, <checkpoint name>.export)",
    )
    write.add_argument(
        "--formats",
        default=",".join(DEFAULT_FORMATS),
        help="comma-separated subset of "
        + ",".join(FORMATS)
        + f" (default: {','.join(DEFAULT_FORMATS)}). onnx: what the service runs; "
        "pt2: torch.export, for torch users (torch.export.load); aoti: compiled ahead of time (C++, "
        "~30 s, opt-in); torchscript: deprecated upstream, kept for stacks that still load it",
    )
    write.add_argument(
        "--fp16",
        action="store_true",
        help="export half-precision artifacts, checked with fp16 tolerances (default: fp32)",
    )
    write.add_argument(
        "--name",
        default=bento.DEFAULT_NAME,
        help=f"model name in the BentoML model store (default: {bento.DEFAULT_NAME})",
    )
    write.add_argument(
        "--no-bento",
        action="store_true",
        help="do not register the result in the BentoML model store (default: register)",
    )
    check = p.add_argument_group("parity check")
    check.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where the eager reference runs; auto: CUDA when present (default: auto)",
    )
    check.add_argument(
        "--samples",
        type=Path,
        default=None,
        help="folder of real images for the parity check "
        "(default: the training data when the checkpoint names it, else scikit-learn's sample photos)",
    )
    check.add_argument(
        "--int8",
        action="store_true",
        help="also write model.int8.onnx: ONNX Runtime's static "
        "INT8 quantization (QDQ, per-channel), calibrated on the training data the checkpoint names "
        "(else --samples), kept only if accuracy holds (see --max-accuracy-drop)",
    )
    check.add_argument(
        "--max-accuracy-drop",
        type=float,
        default=1.0,
        help="INT8: the most top-1 it may lose, in "
        "percentage points, on the validation set (or in agreement with fp32); past it, exit 3 and "
        "the INT8 artifact is marked failed and never served (default: 1.0)",
    )
    check.add_argument("--atol", type=float, default=None, help="absolute tolerance (default: 1e-4, fp16 5e-2)")
    check.add_argument("--rtol", type=float, default=None, help="relative tolerance (default: 1e-3, fp16 5e-2)")
    return p


def _device(choice: str) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available here")
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _formats(value: str) -> list[str]:
    formats = [f.strip() for f in value.split(",") if f.strip()]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise ValueError(f"--formats={value!r}: choose from {', '.join(FORMATS)}")
    return formats


def _check_numbers(args: argparse.Namespace, formats: list[str]) -> None:
    if args.int8 and "onnx" not in formats:
        raise ValueError("--int8 quantizes the ONNX model: keep onnx in --formats")
    if args.int8 and args.fp16:
        raise ValueError("--int8 and --fp16: choose one precision")
    if args.max_accuracy_drop < 0:
        raise ValueError(f"--max-accuracy-drop={args.max_accuracy_drop}: 0 or more percentage points")
    if args.image_size is not None:
        check_image_size(args.image_size)
    for flag, value in (("--atol", args.atol), ("--rtol", args.rtol)):
        if value is not None and value < 0:
            raise ValueError(f"{flag}={value}: a tolerance is 0 or more")


MAX_LABELS_BYTES = 16 * 2**20  # a million names of 16 characters


def _labels(path: Path | None) -> list[str] | None:
    if path is None:
        return None
    if not path.is_file():  # also refuses a FIFO or a device (/dev/zero), which would never end
        raise ValueError(f"--labels={path}: no such file (one class name per line, in index order)")
    if path.stat().st_size > MAX_LABELS_BYTES:
        raise ValueError(f"--labels={path}: larger than {MAX_LABELS_BYTES // 2**20} MB; one class name per line")
    lines = path.read_text().splitlines()
    while lines and not lines[-1].strip():  # a trailing blank line is a habit, not a class
        lines.pop()
    return check_class_names(lines, f"--labels={path}")


def classifier_job(
    args: argparse.Namespace, checkpoint: Path, formats: list[str], device: torch.device, timings: dict[str, float]
) -> Job:
    labels = _labels(args.labels)
    with timed(timings, "load"):
        src = read_source(checkpoint, trust_pickle=args.trust_pickle, ema=args.ema)
        spec = resolve_model(src, args.arch, args.model, args.image_size, labels)
        if src.module is None or args.arch or args.model:
            load_weights(spec, src, arch_is_a_name=not args.model)
    log_loading(src, spec.unwrapped)
    model = spec.model.float().eval()
    check_eval_mode(model)
    source = source_fields(checkpoint, src, spec.unwrapped)
    dtype = "float16" if args.fp16 else "float32"
    manifest = new_manifest(spec.arch, spec.classes, spec.preprocess, dtype, source, timings)
    hints = src.preprocess_hints
    options = CheckOptions(
        args.fp16, tolerance_of(args), args.samples, args.int8, args.max_accuracy_drop, hints.get("val_split")
    )
    data = (src.meta or {}).get("data") or hints.get("data")  # handoff's meta, else the training script's args
    return Job(
        manifest,
        lambda folder: write_and_check(model, spec, data, formats, device, options, manifest, folder),
        f"{spec.arch} ({spec.num_classes} classes)",
    )


def export(args: argparse.Namespace) -> int:
    started = time.monotonic()
    timings: dict[str, float] = {}
    formats = _formats(args.formats)
    _check_numbers(args, formats)
    device = _device(args.device)
    checkpoint = choose_checkpoint(args.checkpoint, args.pick, args.trust_pickle, args.ema)
    if args.example is not None:
        job = tensor_job(args, checkpoint, formats, device, timings)
    else:
        job = classifier_job(args, checkpoint, formats, device, timings)
    manifest = job.manifest
    out = args.out or checkpoint.parent / f"{checkpoint.stem}.export"
    check_out(out, checkpoint)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp.", dir=out.parent))  # an unpredictable name
    os.chmod(staging, 0o755)  # mkdtemp's 0700 would hide the export from a service running as another user
    try:
        status = job.write(staging)
        if status != EXIT_OK and is_export_folder(out) and passed(out):
            kept, out = out, out.with_name(out.name + ".failed")  # a good export survives a failed attempt
            log.warning(
                "this attempt failed its checks: %s keeps the previous, passing export; the attempt is in %s", kept, out
            )
            check_out(out, checkpoint)
        replace_folder(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    seconds = time.monotonic() - started
    if status != EXIT_OK:
        print("\n".join(manifest["parity"]["summary"]), file=sys.stderr)
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
        print(
            f"exported {manifest['arch']} weights to {out} in {seconds:.1f}s; parity NOT CHECKED (no format that "
            "computes: add onnx, torchscript or pt2 to --formats); not registered, and the service will not serve it"
        )
        return EXIT_OK
    tag = None if args.no_bento else bento.register(out, manifest, args.name)
    print("\n".join(manifest["parity"]["summary"]))
    print(
        f"exported {job.described} to {out} in {seconds:.1f}s; parity passed"
        + (f"; BentoML model {tag}" if tag else "")
    )
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    # Our own progress at INFO; the exporter's internals (onnxscript passes) only when they warn.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    log.setLevel(logging.INFO)
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.jit")
    try:
        return export(args)
    except (CheckpointError, LoadMismatch, ValueError, OSError) as err:
        print(f"export: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
