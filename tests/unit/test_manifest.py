"""What serve trusts: the manifest and the artifacts it lists (contract/manifest.py, plain Python)."""

import hashlib
import json
from pathlib import Path

import pytest

from contract.manifest import MANIFEST, MANIFEST_FORMAT, ManifestError, is_export_folder, read_artifact, read_manifest


def make_export(folder: Path, status: str = "passed") -> dict:
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"graph")
    manifest = {
        "format": MANIFEST_FORMAT,
        "status": status,
        "artifacts": {"model.onnx": {"sha256": hashlib.sha256(b"graph").hexdigest(), "bytes": 5}},
    }
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return manifest


def test_a_listed_artifact_comes_back_as_the_bytes_that_were_checked(tmp_path):
    manifest = make_export(tmp_path / "e")
    assert read_artifact(tmp_path / "e", read_manifest(tmp_path / "e"), "model.onnx") == b"graph"
    assert manifest["status"] == "passed" and is_export_folder(tmp_path / "e")


@pytest.mark.parametrize(
    "damage, words",
    [
        ("tamper", "does not match"),
        ("unlisted", "not listed"),
        ("symlink", "symbolic link"),
        ("missing", "missing"),
    ],
)
def test_what_is_refused(tmp_path, damage, words):
    folder = tmp_path / "e"
    manifest = make_export(folder)
    name = "model.onnx"
    if damage == "tamper":
        (folder / name).write_bytes(b"GRAPH")
    elif damage == "unlisted":
        name = "model.torchscript.pt"
        (folder / name).write_bytes(b"planted")
    elif damage == "symlink":
        (tmp_path / "real").write_bytes(b"graph")
        (folder / name).unlink()
        (folder / name).symlink_to(tmp_path / "real")
    else:
        (folder / name).unlink()
    with pytest.raises(ManifestError, match=words):
        read_artifact(folder, manifest, name)


def test_the_manifest_itself(tmp_path):
    make_export(tmp_path / "failed", status="failed")
    with pytest.raises(ManifestError, match="parity did not pass"):
        read_manifest(tmp_path / "failed")
    make_export(tmp_path / "ok")
    pinned = hashlib.sha256((tmp_path / "ok" / MANIFEST).read_bytes()).hexdigest()
    assert read_manifest(tmp_path / "ok", pinned)["status"] == "passed"
    with pytest.raises(ManifestError, match="HANDOFF_MODEL_SHA256"):
        read_manifest(tmp_path / "ok", "0" * 64)
    (tmp_path / "notes").mkdir()
    assert not is_export_folder(tmp_path / "notes")
