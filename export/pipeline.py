"""What every export task shares: the request a task is given (`ExportRequest`), the task's entry in the registry
(`ExportTask`), and the steps after the model: write the formats, prove each against the eager model
(export/tensor_parity.py for a model described by its signature), settle the verdict, close the manifest.

export/run.py owns the whole: read -> task (export/tasks/) -> formats -> parity and provenance -> manifest -> place.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from contract.manifest import (
    AOTI,
    ONNX,
    PT2,
    SAFETENSORS,
    TORCHSCRIPT,
    Manifest,
    describe_artifacts,
    embedded_fields,
    write_manifest,
)
from export.exporters import (
    ExportCall,
    export_aoti,
    export_onnx,
    export_pt2,
    export_safetensors,
    export_torchscript,
)
from export.job import Job
from export.options import SCOPED_FLAGS, ExportOptions
from export.parity import DEFAULT_TOLERANCES, Comparison, Tolerance, parity_report, pin_precision
from export.readers import Source, read_source
from export.readers.hf_checkpoint import HfCheckpoint, find_hf_checkpoint
from export.readers.open_clip import OpenClipCheckpoint, find_open_clip
from export.steps import library_versions, timed
from export.tensor_model import (
    Example,
    SignatureModule,
    dynamic_shapes,
    first_line,
    traceable,
)
from export.tensor_parity import run_tensor_parity

log = logging.getLogger("export")
EXIT_OK, EXIT_PARITY, EXIT_UNCHECKED = 0, 3, 4


@dataclass
class ExportRequest:
    """What a task is given: the command line, its checked options, the checkpoint and where parity runs. The
    checkpoint is read at most once, when a task first asks for it (`source`)."""

    options: ExportOptions
    checkpoint: Path
    device: torch.device
    timings: dict[str, float]

    @functools.cached_property
    def hf(self) -> HfCheckpoint | None:
        """A Hugging Face checkpoint (a Trainer folder, save_pretrained, or weights with --hf-config), else None."""
        options = self.options
        return (
            None
            if options.read.example or options.read.model or options.read.arch
            else find_hf_checkpoint(self.checkpoint, options.read.hf_config)
        )

    @functools.cached_property
    def open_clip(self) -> OpenClipCheckpoint | None:
        """An open_clip checkpoint (a model folder, or open_clip_train's run), else None."""
        read = self.options.read
        return None if read.example or read.model or read.arch or read.hf_config else find_open_clip(self.checkpoint)

    @functools.cached_property
    def source(self) -> Source:
        with timed(self.timings, "read"):
            return read_source(self.checkpoint, trust_pickle=self.options.read.trust_pickle, ema=self.options.read.ema)

    @property
    def arch(self) -> str | None:
        """The architecture: --arch, else the one the checkpoint names (not with --model: the user's own)."""
        return self.options.read.arch or (None if self.options.read.model else self.source.arch)


@dataclass(frozen=True)
class ExportTask:
    """One task's entry in export/tasks/'s registry: its export of a request, and the task flags it takes (any
    other is refused: `refuse_flags_not_for`)."""

    name: str
    """the manifest's `task`"""
    kind: str
    """what it exports, in words, for a person: image classifiers, detectors, ..."""
    job: Callable[[ExportRequest], Job]
    flags: frozenset[str] = frozenset()
    """the task flags (export/options.py's SCOPED_FLAGS) that mean something to it"""


Check = tuple[str, str | None]  # a task's own check: its name, and why it failed (None: it passed)


@dataclass(frozen=True)
class OwnChecks:
    """A task's checks beyond parity (a text model's tokenizer and padding), run on the written folder: the files
    it added there and each check's outcome, recorded in the parity report under `key`."""

    key: str
    run: Callable[[Path], tuple[list[str], list[Check]]]


def library_checks(call: Callable[[], list[Check]]) -> list[Check]:
    """A task's comparison with the user's library (export/reference.py); a library call that raises fails it, in a
    line: the export cannot say it answers as the library does."""
    try:
        return call()
    except Exception as err:  # noqa: BLE001 - the library's own words, whatever it raised
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return [("the library's reference", f"the library's call raised: {first[:300]}")]


def add_own_checks(report: dict[str, Any], key: str, checks: list[Check]) -> None:
    """`checks` in the parity report and its printed table; one that failed fails the export."""
    report[key] = [{"check": name, "pass": reason is None, "reason": reason} for name, reason in checks]
    report["summary"] = [
        *report["summary"],
        *(f"  {name:<22} {'pass' if r is None else 'FAIL: ' + r}" for name, r in checks),
    ]
    if any(reason is not None for _, reason in checks) and report["pass"] is not False:
        report["pass"] = False


def tolerance_of(options: ExportOptions, precision: str | None = None) -> Tolerance:
    """--atol and --rtol, else the default of `precision` (None: --fp16's)."""
    default = DEFAULT_TOLERANCES[precision or ("fp16" if options.write.fp16 else "fp32")]
    return Tolerance(
        options.parity.atol if options.parity.atol is not None else default.atol,
        options.parity.rtol if options.parity.rtol is not None else default.rtol,
        default.min_top1,
    )


def settle(manifest: Manifest) -> int:
    """The manifest's `status` from its parity verdict, and the exit status: passed, 0; failed, 3; not checked, 4
    when the reference gave nothing to compare, 0 when no computing format was asked for (--formats safetensors)."""
    report = manifest["parity"]
    manifest["status"] = {True: "passed", False: "failed", None: "not checked"}[report["pass"]]
    if report["pass"] is False:
        return EXIT_PARITY
    return EXIT_UNCHECKED if report["pass"] is None and report.get("not_checked") else EXIT_OK


def close_manifest(manifest: Manifest, folder: Path, files: list[str]) -> int:
    """The manifest's last steps, for every task: its artifacts' hashes, the library versions, the verdict; written
    into `folder`. Returns the exit status."""
    manifest["artifacts"] = describe_artifacts(folder, files)
    manifest["versions"] = library_versions()
    status = settle(manifest)
    write_manifest(folder, manifest)
    return status


def refuse_flags_not_for(task: ExportTask, options: ExportOptions, tasks: tuple[ExportTask, ...]) -> None:
    """One line naming the task flags given that `task` does not take, and which of `tasks` take them: a flag is
    never silently meaningless."""
    given = sorted(options.given - task.flags)
    if not given:
        return
    flags = ", ".join(SCOPED_FLAGS[name] for name in given)
    takers = sorted({other.kind for other in tasks for name in given if name in other.flags})
    takes = ", ".join(SCOPED_FLAGS[name] for name in sorted(task.flags)) or "none of them"
    raise ValueError(f"{flags}: for {' and '.join(takers)}; not for {task.kind}, which take {takes}")


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


def write_formats(
    model: nn.Module, call: Any, formats: list[str], folder: Path, manifest: Manifest, weights: nn.Module
) -> tuple[dict[str, dict], dict[str, str]]:
    """Each of `formats` written into `folder` from `model` called as `call`, timed into the manifest (`weights`: the
    module whose tensors safetensors holds). Returns what each format wrote, and the formats skipped with why.

    One policy for every task: ONNX, which the service runs, must be written (ValueError: exit 2, nothing kept);
    a format beside it that its exporter cannot write is skipped with the exporter's own words, in the parity table
    and the manifest, and the export goes on."""
    fields = {k: v for k, v in manifest.items() if k not in ("source", "timings")}
    writers: dict[str, tuple[str, Callable[[], dict]]] = {
        "onnx": (ONNX, lambda: export_onnx(model, call, folder / ONNX, embedded_fields(manifest))),
        "pt2": (PT2, lambda: export_pt2(model, call, folder / PT2, fields)),
        "aoti": (AOTI, lambda: export_aoti(model, call, folder / AOTI)),
        "torchscript": (TORCHSCRIPT, lambda: export_torchscript(model, call, folder / TORCHSCRIPT, fields)),
        "safetensors": (SAFETENSORS, lambda: export_safetensors(weights, folder / SAFETENSORS, manifest["arch"])),
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
                    tool = {"torchscript": "torch.jit.trace", "safetensors": "safetensors"}.get(name, "torch.export")
                    skipped[artifact] = f"{tool} cannot export this model: {first_line(err)}"
                    for leftover in (folder / artifact, folder / f"{artifact}.data"):
                        leftover.unlink(missing_ok=True)
    return exported, skipped


def write_tensor_export(
    model: SignatureModule,
    example: Example,
    dynamic: dict[str, tuple[int, ...]],
    formats: list[str],
    device: torch.device,
    tol: Tolerance,
    manifest: Manifest,
    folder: Path,
    own: OwnChecks | None = None,
) -> int:
    """Write every format into `folder`, check each against the eager model, run the task's `own` checks, complete the
    manifest; the exit status. Formats are written as `write_formats` writes them; one that raises on a parity
    case (torch.export specialising a dimension the example declared dynamic) is skipped with its reason in the
    table and the manifest, its files removed; a numerical mismatch in any format fails the export."""
    call = ExportCall(
        tuple(traceable(example).inputs.values()),
        model.input_names,
        model.output_names,
        dynamic_shapes(example, dynamic),
    )
    exported, skipped = write_formats(model, call, formats, folder, manifest, model.model)
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
    files = [f for e in exported.values() for f in e["files"]]
    if own is not None:
        more, checks = own.run(folder)
        files += more
        add_own_checks(manifest["parity"], own.key, checks)
    return close_manifest(manifest, folder, files)
