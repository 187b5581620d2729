"""`python -m export`'s options, typed and grouped, built once from the command line (export/cli.py's parser) and
checked there, before torch is imported: what to read, what to write, how to check it.

A task takes only the task flags it declares (`ExportTask.flags`); one it does not take is refused in one line,
naming the tasks it is for (`refuse_flags_not_for`), so no flag is ever silently meaningless.
"""

from __future__ import annotations

import argparse
from dataclasses import astuple, dataclass
from pathlib import Path

from contract.manifest import FORMATS
from contract.preprocessing import check_image_size
from export.int4_gate import DEFAULT_GATE, Int4Gate
from train.class_names import check_class_names

MAX_LABELS_BYTES = 16 * 2**20  # a million names of 16 characters
# The flags that mean something to some tasks only, by their option name: each task declares those it takes.
SCOPED_FLAGS = {
    "arch": "--arch",
    "image_size": "--image-size",
    "labels": "--labels",
    "min_size": "--min-size",
    "max_size": "--max-size",
    "model": "--model",
    "example": "--example",
    "dynamic": "--dynamic",
    "text_pairs": "--text-pairs",
    "fp16": "--fp16",
    "int8": "--int8",
    "max_accuracy_drop": "--max-accuracy-drop",
    "samples": "--samples",
    "own_reference": "--own-reference",
    "prompts": "--prompts",
    "new_tokens": "--new-tokens",
    "int4": "--int4",
    "int4_min_agreement": "--int4-min-agreement",
    "int4_max_loglik_drop": "--int4-max-loglik-drop",
}


@dataclass(frozen=True)
class ReadOptions:
    """What to read: the checkpoint(s), and what the checkpoint itself may not say."""

    checkpoints: list[Path]
    pick: int | None
    arch: str | None
    ema: bool
    model: str | None
    example: Path | None
    dynamic: list[str]
    image_size: int | None
    min_size: int | None
    max_size: int | None
    labels: list[str] | None
    """--labels' class names, read and checked (None: the checkpoint's, else 0..N-1)"""
    hf_config: Path | None
    tokenizer: Path | None
    text_pairs: bool
    trust_remote_code: bool
    allow_partial: bool
    trust_pickle: bool


@dataclass(frozen=True)
class WriteOptions:
    """What to write, and where."""

    out: Path | None
    formats: list[str]
    fp16: bool
    name: str
    register: bool
    """register the export in BentoML's model store (not --no-bento)"""


@dataclass(frozen=True)
class ParityOptions:
    """How the export is proved."""

    device: str
    samples: Path | None
    int8: bool
    max_accuracy_drop: float
    accept_unchecked: bool
    own_reference: bool
    prompts: Path | None
    new_tokens: int
    int4: bool
    int4_gate: Int4Gate
    atol: float | None
    rtol: float | None


@dataclass(frozen=True)
class ExportOptions:
    read: ReadOptions
    write: WriteOptions
    parity: ParityOptions
    given: frozenset[str]
    """the task flags given a value other than their default (SCOPED_FLAGS' names)"""

    @classmethod
    def from_args(cls, args: argparse.Namespace, parser: argparse.ArgumentParser) -> ExportOptions:
        """The options of a parsed command line, each checked that needs neither torch nor the checkpoint;
        ValueError says what is wrong, in one line."""
        formats = _formats(args.formats)
        _check_numbers(args, formats)
        read = ReadOptions(
            checkpoints=args.checkpoint,
            pick=args.pick,
            arch=args.arch,
            ema=args.ema,
            model=args.model,
            example=args.example,
            dynamic=args.dynamic,
            image_size=args.image_size,
            min_size=args.min_size,
            max_size=args.max_size,
            labels=_labels(args.labels),
            hf_config=args.hf_config,
            tokenizer=args.tokenizer,
            text_pairs=args.text_pairs,
            trust_remote_code=args.trust_remote_code,
            allow_partial=args.allow_partial,
            trust_pickle=args.trust_pickle,
        )
        write = WriteOptions(out=args.out, formats=formats, fp16=args.fp16, name=args.name, register=not args.no_bento)
        parity = ParityOptions(
            device=args.device,
            samples=args.samples,
            int8=args.int8,
            max_accuracy_drop=args.max_accuracy_drop,
            accept_unchecked=args.accept_unchecked,
            own_reference=args.own_reference,
            prompts=args.prompts,
            new_tokens=args.new_tokens,
            int4=args.int4,
            int4_gate=Int4Gate(args.int4_min_agreement, args.int4_max_loglik_drop),
            atol=args.atol,
            rtol=args.rtol,
        )
        given = frozenset(name for name in SCOPED_FLAGS if getattr(args, name) != parser.get_default(name))
        return cls(read, write, parity, given)


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
    for flag, size in (("--min-size", args.min_size), ("--max-size", args.max_size)):
        if size is not None and not 32 <= size <= 4096:
            raise ValueError(f"{flag}={size}: a detector's resize target between 32 and 4096 pixels")
    for flag, value in (("--atol", args.atol), ("--rtol", args.rtol)):
        if value is not None and value < 0:
            raise ValueError(f"{flag}={value}: a tolerance is 0 or more")
    if (args.int4_min_agreement, args.int4_max_loglik_drop) != astuple(DEFAULT_GATE) and not args.int4:
        raise ValueError("--int4-min-agreement and --int4-max-loglik-drop bound --int4's gate: add --int4")
    if not 0 <= args.int4_min_agreement <= 1 or args.int4_max_loglik_drop < 0:
        raise ValueError("--int4-min-agreement is a share (0 to 1), --int4-max-loglik-drop nats (at least 0)")
    if args.new_tokens < 1:
        raise ValueError(f"--new-tokens={args.new_tokens}: at least 1")


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
