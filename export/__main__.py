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
import contextlib
import copy
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from export import bento
from export.architecture import ModelSpec, load_weights, resolve_model
from export.exporters import (
    check_eval_mode,
    export_aoti,
    export_onnx,
    export_pt2,
    export_safetensors,
    export_torchscript,
)
from export.inputs import parity_inputs
from export.int8 import quantize, report_dict
from export.manifest import (
    AOTI,
    DEFAULT_FORMATS,
    FORMATS,
    MANIFEST,
    ONNX,
    ONNX_INT8,
    PT2,
    SAFETENSORS,
    TORCHSCRIPT,
    ManifestError,
    describe_artifacts,
    embedded_fields,
    is_export_folder,
    new_manifest,
    read_manifest,
    write_manifest,
)
from export.parity import DEFAULT_TOLERANCES, Tolerance, parity_report, pin_precision, run_parity
from export.sources import read_source
from export.unwrap import LoadMismatch
from train.checkpoint import CheckpointError
from train.class_names import check_class_names
from train.data import check_image_size

log = logging.getLogger("export")

EXIT_OK, EXIT_BAD_INPUT, EXIT_PARITY = 0, 2, 3
EXPORT_BATCH = 2


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
        help="a .pt/.pth/.pth.tar/.ckpt/.bin/.safetensors file, or a folder: "
        "torch.distributed.checkpoint (FSDP2, torchtitan step-N) or Accelerate save_state",
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


def _versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import torchvision

    return {
        "torch": str(torch.__version__),
        "torchvision": torchvision.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


@contextlib.contextmanager
def _timed(timings: dict[str, float], name: str) -> Iterator[None]:
    started = time.monotonic()
    yield
    timings[name] = round(time.monotonic() - started, 3)


def export(args: argparse.Namespace) -> int:
    started = time.monotonic()
    timings: dict[str, float] = {}
    formats = _formats(args.formats)
    _check_numbers(args, formats)
    device = _device(args.device)
    labels = _labels(args.labels)
    with _timed(timings, "load"):
        src = read_source(args.checkpoint, trust_pickle=args.trust_pickle, ema=args.ema)
        spec = resolve_model(src, args.arch, args.model, args.image_size, labels)
        if src.module is None or args.arch or args.model:
            load_weights(spec, src, arch_is_a_name=not args.model)
    if spec.unwrapped.removed:
        log.info("removed wrapper prefixes: %s", ", ".join(spec.unwrapped.removed))
    if src.device_tags and src.device_tags != ["cpu"]:
        log.info("tensors saved on %s, loaded on the CPU", ", ".join(src.device_tags))
    model = spec.model.float().eval()
    check_eval_mode(model)

    pre = spec.preprocess
    source = {
        "checkpoint": str(args.checkpoint.resolve()),
        "sha256": src.sha256,
        "container": src.kind,
        "weights": f"EMA ({src.ema_key})" if src.ema_chosen else "trained",
        "removed_prefixes": spec.unwrapped.removed,
        "ignored_keys": spec.unwrapped.ignored[:20],
        "device_tags": [t for t in src.device_tags if t != "cpu"],
    }
    manifest = new_manifest(spec.arch, spec.classes, pre, "float16" if args.fp16 else "float32", source, timings)
    options = CheckOptions(args.fp16, _tolerance(args), args.samples, args.int8, args.max_accuracy_drop)
    out = args.out or args.checkpoint.parent / f"{args.checkpoint.stem}.export"
    _check_out(out, args.checkpoint)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp.", dir=out.parent))  # an unpredictable name
    os.chmod(staging, 0o755)  # mkdtemp's 0700 would hide the export from a service running as another user
    try:
        status = _write_and_check(
            model, spec, (src.meta or {}).get("data"), formats, device, options, manifest, staging
        )
        if status != EXIT_OK and is_export_folder(out) and _passed(out):
            kept, out = out, out.with_name(out.name + ".failed")  # a good export survives a failed attempt
            log.warning(
                "this attempt failed its checks: %s keeps the previous, passing export; the attempt is in %s", kept, out
            )
            _check_out(out, args.checkpoint)
        _replace_folder(staging, out)
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
            f"exported {spec.arch} weights to {out} in {seconds:.1f}s; parity NOT CHECKED (no format that computes: "
            "add onnx, torchscript or pt2 to --formats); not registered, and the service will not serve it"
        )
        return EXIT_OK
    tag = None if args.no_bento else bento.register(out, manifest, args.name)
    print("\n".join(manifest["parity"]["summary"]))
    print(
        f"exported {spec.arch} ({spec.num_classes} classes) to {out} in {seconds:.1f}s; parity passed"
        + (f"; BentoML model {tag}" if tag else "")
    )
    return EXIT_OK


@dataclass(frozen=True)
class CheckOptions:
    """How the artifacts are checked (from the command line)."""

    fp16: bool
    tolerance: Tolerance
    samples: Path | None  # real images for parity and INT8 calibration, when the checkpoint names no data
    int8: bool
    max_accuracy_drop: float


def _tolerance(args: argparse.Namespace) -> Tolerance:
    default = DEFAULT_TOLERANCES["fp16" if args.fp16 else "fp32"]
    return Tolerance(
        args.atol if args.atol is not None else default.atol,
        args.rtol if args.rtol is not None else default.rtol,
        default.min_top1,
    )


def _write_and_check(
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
    example_typed = example.half() if options.fp16 else example
    exported: dict[str, dict] = {}
    timings = manifest["timings"]
    with torch.inference_mode(False), torch.no_grad():
        if "onnx" in formats:
            with _timed(timings, "onnx"):
                exported["onnx"] = export_onnx(artifact_model, example_typed, folder / ONNX, embedded_fields(manifest))
        fields = {k: manifest[k] for k in manifest if k not in ("source", "timings")}
        if "pt2" in formats:
            with _timed(timings, "pt2"):
                exported["pt2"] = export_pt2(artifact_model, example_typed, folder / PT2, fields)
        if "aoti" in formats:
            with _timed(timings, "aoti"):
                exported["aoti"] = export_aoti(artifact_model, example_typed, folder / AOTI)
        if "torchscript" in formats:
            with _timed(timings, "torchscript"):
                exported["torchscript"] = export_torchscript(
                    artifact_model, example_typed, folder / TORCHSCRIPT, fields
                )
        if "safetensors" in formats:
            with _timed(timings, "safetensors"):
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
    with _timed(timings, "parity"):
        inputs, described = parity_inputs(pre, data, options.samples)
        computing = set(formats) - {"safetensors"}
        results = run_parity(model, folder, inputs, formats, device, options.fp16, tol) if computing else []
    manifest["parity"] = parity_report(results, device, options.fp16, tol, precision, len(inputs), described)
    int8_passed = True
    if options.int8 and manifest["parity"]["pass"]:
        with _timed(timings, "int8"):
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
    manifest["versions"] = _versions()
    verdict = manifest["parity"]["pass"]
    manifest["status"] = {True: "passed", False: "failed", None: "not checked"}[verdict]
    write_manifest(folder, manifest)
    return EXIT_PARITY if verdict is False or not int8_passed else EXIT_OK


def _check_out(out: Path, checkpoint: Path) -> None:
    """Refuse an output folder whose replacement would delete something that is not an export."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ValueError(f"--out={out}: exists and is not a folder; choose another --out")
    resolved, source = out.resolve(), checkpoint.resolve()
    if resolved == source or resolved in source.parents:
        raise ValueError(f"--out={out}: holds the checkpoint being exported; choose another --out")
    if out.exists() and any(out.iterdir()) and not is_export_folder(out):
        raise ValueError(
            f"--out={out}: exists and is not an export folder (no handoff {MANIFEST}); export replaces "
            "only a previous export, so choose another --out or empty it yourself"
        )


def _passed(folder: Path) -> bool:
    try:
        read_manifest(folder)
        return True
    except ManifestError:
        return False


def _replace_folder(staging: Path, out: Path) -> None:
    """Swap the finished folder in: `out` is never a half-written export. Only an export is replaced."""
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
        out.rename(old / out.name)
        staging.rename(out)
        shutil.rmtree(old)
    else:
        staging.rename(out)


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
