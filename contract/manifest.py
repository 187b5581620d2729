"""The export folder's manifest: the one description serve trusts (see DESIGN.md).

Plain Python and JSON on purpose: the serving path imports this module and must not need torch.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any, TypedDict, cast

from contract.signature import TASK_IMAGE_CLASSIFICATION, TASK_TENSORS, Signature, classifier_signature

MANIFEST_FORMAT = "handoff.manifest/1"
MANIFEST = "manifest.json"
ONNX, ONNX_DATA, TORCHSCRIPT, SAFETENSORS = "model.onnx", "model.onnx.data", "model.torchscript.pt", "model.safetensors"
PT2, AOTI, ONNX_INT8 = "model.pt2", "model.aoti.pt2", "model.int8.onnx"
FORMATS = {"onnx": ONNX, "pt2": PT2, "aoti": AOTI, "torchscript": TORCHSCRIPT, "safetensors": SAFETENSORS}
DEFAULT_FORMATS = ("onnx", "pt2", "torchscript", "safetensors")  # aoti is opt-in: it compiles C++ (~30 s)
# The manifest fields the ONNX file carries too (its metadata_props), so it describes itself alone.
EMBEDDED_FIELDS = ("format", "task", "signature", "arch", "num_classes", "labels", "input", "preprocess")


# The manifest's shape, section by section: mypy checks every key the code reads or writes against these (a misspelt
# or another task's key fails `make lint`). Sections a task alone writes are optional (total=False); what each holds
# is described in docs/design.md ("The export folder").


class Artifact(TypedDict):
    sha256: str
    bytes: int


class InputSection(TypedDict):
    shape: list[int]
    dtype: str
    layout: str


class SourceSection(TypedDict, total=False):
    checkpoint: str
    sha256: str
    container: str
    weights: str
    removed_prefixes: list[str]
    ignored_keys: list[str]
    device_tags: list[str]
    files: dict[str, str]  # each file of a folder: read, or set aside and why
    set_aside: list[str]


class OnnxSection(TypedDict, total=False):
    opset: int
    external_data: bool
    exporter: str
    input_name: str
    output_name: str


class ReferenceSection(TypedDict, total=False):
    library: str
    version: str | None  # None: handoff's own model
    call: str
    not_the_library: str | None


class HfSection(TypedDict, total=False):
    model_type: str
    architecture: str
    config: str  # the file the export copied: config.json
    dtype: str


class Origin(TypedDict):
    """Where the weights came from (export/job.py's `origin_fields`): every manifest's `source` and `provenance`."""

    source: SourceSection
    provenance: dict[str, Any]


class GenaiSection(TypedDict, total=False):
    folder: str  # the GenAI model served
    precision: str  # its precision: fp32 (CPU), fp16 (CUDA), int4 (--int4, past its gate)
    gate: dict[str, Any]  # --int4: the accuracy gate's figures and bounds (export/int4_gate.py)
    proved: dict[str, str]  # --int4: the model parity proved against transformers, which the gate measured int4 by


class Manifest(TypedDict, total=False):
    """manifest.json, as export writes it and serve reads it."""

    # every export
    format: str
    task: str
    signature: dict[str, Any]
    arch: str
    source: SourceSection
    provenance: dict[str, Any]
    timings: dict[str, float]
    parity: dict[str, Any]
    artifacts: dict[str, Artifact]
    versions: dict[str, str]
    status: str
    onnx: OnnxSection | None  # None: no ONNX file written
    dynamic: dict[str, list[int]]
    # image classifiers
    num_classes: int
    labels: list[str]
    classes: list[str]  # an older image classifier's `labels`
    input: InputSection
    preprocess: dict[str, Any]
    preprocess_check: dict[str, Any]
    decode: dict[str, Any]
    int8: dict[str, Any]
    scores: str
    # Hugging Face models
    hf: HfSection
    reference: ReferenceSection
    read: list[str]
    tokenizer: dict[str, Any]
    audio: dict[str, Any]  # an audio model's features (contract/audio_features.py's AudioFeatures)
    image_text: dict[str, Any]  # an image-text model's zero-shot settings (contract/image_text.py)
    open_clip: dict[str, Any]  # an open_clip export: the model open_clip built and the training settings it honoured
    speech: dict[str, Any]  # a Whisper's decoding settings (contract/speech.py's SpeechSettings)
    towers: dict[str, str]  # an image-text model's towers: each an export of its own, in this folder
    embedding: dict[str, Any]
    rerank_scores: str
    generation: dict[str, Any]
    generation_config: dict[str, Any]
    genai: GenaiSection
    # detectors and segmenters
    detection: dict[str, Any]
    segmentation: dict[str, Any]


class ManifestError(Exception):
    """A manifest or artifact that must not be served, with a one-line reason."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def describe_artifacts(folder: Path, names: list[str]) -> dict[str, Artifact]:
    return {name: {"sha256": sha256_file(folder / name), "bytes": (folder / name).stat().st_size} for name in names}


def new_manifest(
    arch: str,
    classes: list[str],
    preprocess: dict[str, Any],
    dtype: str,
    origin: Origin,
    timings: dict[str, float],
) -> Manifest:
    """The manifest's description of the model; export adds `onnx`, `parity`, `int8`, `artifacts`,
    `versions` and `status` as it writes and checks the artifacts."""
    input_shape = [-1, preprocess["channels"], preprocess["crop"], preprocess["crop"]]
    return {
        "format": MANIFEST_FORMAT,
        "task": TASK_IMAGE_CLASSIFICATION,
        "signature": classifier_signature(input_shape, len(classes), dtype).to_dict(),
        "arch": arch,
        "num_classes": len(classes),
        "labels": classes,
        "input": {
            "shape": input_shape,
            "dtype": dtype,
            "layout": "NCHW",
        },
        "preprocess": preprocess,
        **origin,  # `source` and `provenance` (export/job.py)
        "timings": timings,  # seconds per phase, filled in as they finish
    }


def new_tensor_manifest(
    arch: str, signature: Signature, dynamic: dict[str, list[int]], origin: Origin, timings: dict[str, float]
) -> Manifest:
    """The manifest of any other model (`task` tensors): its signature instead of classes and preprocessing."""
    return {
        "format": MANIFEST_FORMAT,
        "task": TASK_TENSORS,
        "signature": signature.to_dict(),
        "arch": arch,
        "dynamic": dynamic,  # the --dynamic dimensions beyond the batch, by input
        **origin,  # `source` and `provenance` (export/job.py)
        "timings": timings,
    }


def labels_of(manifest: Manifest) -> list[str] | None:
    """The model's class names, index by index: `labels` in every manifest (an image classifier's said `classes`
    before, and is still read); None for a model without classes."""
    labels = manifest.get("labels", manifest.get("classes"))
    return None if labels is None else list(labels)


def embedded_fields(manifest: Manifest) -> dict[str, str]:
    """Manifest fields as ONNX metadata_props (string values; JSON where not a string)."""
    return {
        f"handoff.{key}": value if isinstance(value, str) else json.dumps(value)
        for key, value in manifest.items()
        if key in EMBEDDED_FIELDS
    }


def write_manifest(folder: Path, manifest: Manifest) -> None:
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def _listed(manifest: Manifest, name: str) -> dict[str, Any]:
    """The manifest's entry for artifact `name`; ManifestError for a file it does not list."""
    listed = manifest.get("artifacts") or {}
    if name not in listed:
        raise ManifestError(
            f"{name}: not listed in the manifest (this export was made without it, or the file "
            f"was put there afterwards); listed: {', '.join(sorted(listed)) or 'nothing'}"
        )
    return dict(listed[name])


def _read_regular_file(path: Path) -> bytes:
    """The bytes of `path`, refusing a symlink (O_NOFOLLOW) or anything but a regular file."""
    with os.fdopen(_open_regular(path), "rb") as f:
        return f.read()


def _open_regular(path: Path) -> int:
    """A descriptor of `path` open for reading, refusing a symlink (O_NOFOLLOW) or anything but a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise ManifestError(f"{path.name}: missing") from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ManifestError(f"{path.name}: is a symbolic link; an export folder holds its own files") from None
        raise ManifestError(f"{path.name}: cannot be read ({err.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ManifestError(f"{path.name}: not a regular file")
    return fd


def read_manifest_unchecked(folder: Path) -> Manifest:
    """The manifest of any export, passed or not (for reports and tools; serve uses read_manifest)."""
    return json.loads((Path(folder) / MANIFEST).read_text())


def read_manifest(folder: Path, expected_sha256: str | None = None) -> Manifest:
    """The manifest of a passed export; `expected_sha256` pins the manifest file's own bytes."""
    path = Path(folder) / MANIFEST
    if not path.exists() and not path.is_symlink():
        raise ManifestError(f"{path}: no manifest; is this an export folder written by `python -m export`?")
    data = _read_regular_file(path)
    if expected_sha256 is not None and hashlib.sha256(data).hexdigest() != expected_sha256.lower():
        raise ManifestError(
            f"{MANIFEST}: sha256 {hashlib.sha256(data).hexdigest()[:12]}… is not the pinned "
            f"{expected_sha256[:12]}… (HANDOFF_MODEL_SHA256)"
        )
    try:
        manifest = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ManifestError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ManifestError(f"{path}: format {found!r}, expected {MANIFEST_FORMAT!r}")
    if manifest.get("status") != "passed":
        raise ManifestError(f"{path}: export status is {manifest.get('status')!r}: parity did not pass")
    return cast(Manifest, manifest)  # its format and status checked; each task checks its own fields as it loads


def fast_decode_checked(manifest: Manifest) -> dict[str, Any] | None:
    """The export's check of the fast JPEG decode (export/decode_check.py), or None for an export without one."""
    return (manifest.get("decode") or {}).get("fast")


def fast_decode_passed(manifest: Manifest) -> bool:
    """Whether that check passed: the service then decodes large JPEGs the fast way unless HANDOFF_DECODE=exact."""
    return (fast_decode_checked(manifest) or {}).get("passed") is True


def is_export_folder(folder: Path) -> bool:
    """Whether `folder` holds a handoff manifest (passed or failed): the only kind of folder export replaces."""
    try:
        manifest = json.loads(_read_regular_file(Path(folder) / MANIFEST))
    except (ManifestError, json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == MANIFEST_FORMAT


def copy_artifact(folder: Path, manifest: Manifest, name: str, dest: Path, chunk: int = 1 << 24) -> None:
    """Artifact `name` copied to `dest` a chunk at a time (a model of gigabytes is never held whole), hashed on the
    way and checked against the manifest; `dest` is removed and ManifestError raised where it differs."""
    expected = _listed(manifest, name)["sha256"]
    digest = hashlib.sha256()
    with os.fdopen(_open_regular(Path(folder) / name), "rb") as source, open(dest, "wb") as out:
        while block := source.read(chunk):
            digest.update(block)
            out.write(block)
    if digest.hexdigest() != expected:
        dest.unlink()
        raise ManifestError(f"{name}: sha256 {digest.hexdigest()[:12]}… does not match the manifest's {expected[:12]}…")


def read_artifact(folder: Path, manifest: Manifest, name: str) -> bytes:
    """The bytes of artifact `name`, read once and checked against the manifest's sha256.

    The caller builds its runtime from these very bytes, so nothing can swap the file between the check
    and the load. An artifact the manifest does not list is refused: a file dropped into the folder
    later (or left by an export of other formats) is never served.
    """
    expected = _listed(manifest, name)["sha256"]
    data = _read_regular_file(Path(folder) / name)
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise ManifestError(f"{name}: sha256 {actual[:12]}… does not match the manifest's {expected[:12]}…")
    return data
