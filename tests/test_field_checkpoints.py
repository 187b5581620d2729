"""Checkpoints as the field's training scripts write them, built with the real libraries (timm's own
CheckpointSaver, Accelerate's own save_state, DCP with FSDP2 on 2 gloo processes; torchvision's references
by their exact save call), each exported and compared with an eager model holding the weights it should."""

from __future__ import annotations

import argparse
import os
import pickle
import sys
from pathlib import Path

import checkpoint_fixtures as fx
import numpy as np
import pytest
import torch
from conftest import ROOT, run
from test_export import assert_one_line_error, export_cli, onnx_logits, read_manifest

from train.models import build_model

pytestmark = pytest.mark.xdist_group("field")  # its module fixtures stay on one worker


@pytest.fixture(scope="module")
def field(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("field")


@pytest.fixture(scope="module")
def dcp_folders(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dcp")
    done = run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(ROOT / "tests" / "fixtures" / "dcp_fsdp2.py"),
            str(out),
        ],
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def assert_exports_like(checkpoint: Path, arch: str, state: dict, out: Path, *flags: str) -> dict:
    """Export with `flags` only, then compare the ONNX file with an eager `arch` holding `state`."""
    result = export_cli(str(checkpoint), *flags, "--formats", "onnx", "--out", str(out), "--no-bento")
    assert result.returncode == 0, result.stderr
    manifest = read_manifest(out)
    assert manifest["arch"] == arch and manifest["status"] == "passed"
    size = manifest["preprocess"]["crop"]
    model = build_model(arch, fx.CLASSES, size)
    model.load_state_dict(state)
    x = torch.randn(3, 3, size, size)
    with torch.inference_mode():
        expected = model.eval()(x).numpy()
    np.testing.assert_allclose(onnx_logits(out, x), expected, atol=1e-4, rtol=1e-3)
    manifest["stderr"] = result.stderr
    return manifest


def test_torchvision_reference_with_and_without_ema(field, tmp_path):
    path, trained, ema = fx.torchvision_reference(field)
    manifest = assert_exports_like(path, fx.ARCH, trained, tmp_path / "trained")  # no flags at all
    assert manifest["source"]["container"] == "torchvision-reference" and manifest["source"]["weights"] == "trained"
    assert "also holds EMA weights (model_ema)" in manifest["stderr"] and "--ema" in manifest["stderr"]
    # The reference's own evaluation settings: --val-resize-size 36, --val-crop-size 32, bilinear.
    assert (manifest["preprocess"]["resize"], manifest["preprocess"]["crop"]) == (36, fx.SIZE)
    # Parity ran on the validation images of the data the script's own --data-path names.
    assert (
        "6 real" in manifest["parity"]["inputs_described"] and "imagenet/val" in manifest["parity"]["inputs_described"]
    )
    manifest = assert_exports_like(path, fx.ARCH, ema, tmp_path / "ema", "--ema")
    assert manifest["source"]["weights"] == "EMA (model_ema)"


def test_timm_checkpoint_saver_with_and_without_ema(field, tmp_path):
    path, trained, ema = fx.timm_checkpoint(field)
    arch = f"timm/{fx.TIMM_ARCH}"
    manifest = assert_exports_like(path, arch, trained, tmp_path / "trained")
    assert manifest["source"]["container"] == "timm"
    pre = manifest["preprocess"]
    # The run's --img-size 64, with timm's data config for resnet18d: bicubic, crop_pct 0.875 -> floor(64 / 0.875).
    assert (pre["crop"], pre["resize"], pre["interpolation"]) == (64, 73, "bicubic")
    assert "timm_data/validation" in manifest["parity"]["inputs_described"], manifest["parity"]["inputs_described"]
    manifest = assert_exports_like(path, arch, ema, tmp_path / "ema", "--ema")
    assert manifest["source"]["weights"] == "EMA (state_dict_ema)"


@pytest.mark.parametrize("layout", ["nested/step-3", "torchtitan", "recipe/step-3"])
def test_dcp_folders_written_by_fsdp2(layout, dcp_folders, tmp_path):
    expected = torch.load(dcp_folders / "expected.pt", weights_only=True)
    manifest = assert_exports_like(
        dcp_folders / layout, fx.ARCH, expected, tmp_path / "out", "--arch", fx.ARCH, "--image-size", "32"
    )
    assert manifest["source"]["container"] == "dcp"
    if layout == "torchtitan":  # the folder holding step-N folders: the newest is read
        assert "reading the newest, step-3" in manifest["stderr"]


def test_a_hugging_face_model_saved_with_pytorchs_fsdp2_recipe_exports_its_own_weights(dcp_folders, tmp_path):
    """`dcp.save({"app": AppState(model, optimizer)})` (keys `app.model.*` beside `app.optim.*`) of a DistilBERT
    under FSDP2, with --hf-config: every tensor of the export is the checkpoint's, none of the optimizer's."""
    import onnxruntime as ort
    import transformers

    out = tmp_path / "hf"
    folder, base = dcp_folders / "hf_recipe" / "step-3", dcp_folders / "hf_base"
    done = export_cli(str(folder), "--hf-config", str(base), "--formats", "onnx", "--out", str(out), "--no-bento")
    assert done.returncode == 0, done.stderr[-2000:]
    proof = read_manifest(out)["provenance"]
    expected = torch.load(dcp_folders / "hf_expected.pt", weights_only=True)
    assert proof["matched"] == proof["model_tensors"] == proof["checkpoint_tensors"] == len(expected)
    model = transformers.AutoModelForSequenceClassification.from_config(transformers.AutoConfig.from_pretrained(base))
    model.load_state_dict(expected)
    model.eval()
    ids = torch.randint(1, 64, (3, 8))
    with torch.inference_mode():
        eager = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.numpy()
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    served = session.run(None, {"input_ids": ids.numpy(), "attention_mask": np.ones((3, 8), dtype=np.int64)})[0]
    np.testing.assert_allclose(served, eager, atol=1e-5)


def test_dcp_reads_the_model_tensors_only(dcp_folders):
    from export.readers import read_source

    src = read_source(dcp_folders / "torchtitan" / "step-3")
    assert not any(k.startswith(("optimizer", "lr_scheduler", "dataloader", "train_state")) for k in src.state_dict)
    assert src.state_dict.keys() == torch.load(dcp_folders / "expected.pt", weights_only=True).keys()


def test_accelerate_folders(field, tmp_path):
    folders, state = fx.accelerate_folders(field / "accelerate")
    for name, folder in folders.items():
        manifest = assert_exports_like(folder, fx.ARCH, state, tmp_path / name, "--arch", fx.ARCH, "--image-size", "32")
        assert manifest["source"]["container"] == "accelerate"


def test_a_folder_that_is_no_checkpoint_is_named(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "notes.txt").write_text("hello")
    (folder / "logs").mkdir()
    assert_one_line_error(export_cli(str(folder), "--arch", fx.ARCH, "--no-bento"), "neither", "notes.txt", "logs/")


def test_ema_asked_for_where_there_is_none(checkpoints_dir, tmp_path):
    assert_one_line_error(
        export_cli(str(checkpoints_dir / "bare.pth"), "--arch", fx.ARCH, "--ema", "--no-bento"),
        "--ema",
        "no EMA weights",
    )


@pytest.fixture(scope="module")
def checkpoints_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("plain")
    torch.save(fx.fresh_model().state_dict(), folder / "bare.pth")
    return folder


class Payload:
    """Runs a shell command when unpickled without restriction."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("carried", ["reduce payload", "callable"])
def test_a_namespace_carrying_code_is_refused_without_running_it(carried, tmp_path):
    marker = tmp_path / "pwned"
    value = Payload(marker) if carried == "reduce payload" else os.system
    args = argparse.Namespace(model=fx.ARCH, evil=value)
    path = tmp_path / "model_1.pth"
    torch.save({"model": fx.fresh_model().state_dict(), "args": args, "epoch": 1}, path)
    result = export_cli(str(path), "--out", str(tmp_path / "out"), "--no-bento")
    assert_one_line_error(result, "system", "--trust-pickle")
    assert not marker.exists(), "the payload ran"
    assert not (tmp_path / "out").exists()


def test_a_planted_dcp_metadata_payload_is_refused(dcp_folders, tmp_path):
    import shutil

    folder = tmp_path / "step-3"
    shutil.copytree(dcp_folders / "nested" / "step-3", folder)
    marker = tmp_path / "pwned"
    (folder / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    assert_one_line_error(export_cli(str(folder), "--arch", fx.ARCH, "--no-bento"), ".metadata", "refused")
    assert not marker.exists(), "the payload ran"


def test_forged_dcp_metadata_opens_and_allocates_nothing_it_names(dcp_folders, tmp_path):
    """A .metadata naming a storage file outside its folder (`../`), or claiming tensors far larger than its
    shards hold: refused with one line before anything is opened or allocated."""
    import shutil

    original = pickle.loads((dcp_folders / "nested" / "step-3" / ".metadata").read_bytes())  # our own fixture
    (tmp_path / "secret.distcp").write_bytes(b"outside")
    for forgery in ("escape", "huge"):
        folder = tmp_path / forgery / "step-3"
        shutil.copytree(dcp_folders / "nested" / "step-3", folder)
        metadata = pickle.loads(pickle.dumps(original))
        if forgery == "escape":
            for item in metadata.storage_data.values():
                item.relative_path = "../../secret.distcp"
            words = "not a file in its own folder"
        else:
            key = next(k for k, m in metadata.state_dict_metadata.items() if k.endswith("fc.weight"))
            metadata.state_dict_metadata[key].size = torch.Size([10**6, 10**6])
            words = "claims"
        (folder / ".metadata").write_bytes(pickle.dumps(metadata))
        result = export_cli(str(folder), "--arch", fx.ARCH, "--out", str(tmp_path / f"{forgery}.out"), "--no-bento")
        assert_one_line_error(result, words, "refused")


def test_checkpoints_that_are_not_regular_files_are_refused(tmp_path):
    """A link to /dev/zero (never ends), a FIFO (blocks open()), a zip inside a zip, a safetensors header
    claiming a huge tensor: one line each, at once."""
    import json as json_module
    import struct
    import zipfile

    (tmp_path / "zero.pth").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo.pth")
    inner = tmp_path / "inner.pth"
    torch.save({"x": torch.zeros(2)}, inner)
    with zipfile.ZipFile(tmp_path / "nested.pth", "w") as outer:
        outer.write(inner, "archive/data.pkl")
    header = json_module.dumps({"w": {"dtype": "F32", "shape": [10**6, 10**6], "data_offsets": [0, 4 * 10**12]}})
    (tmp_path / "huge.safetensors").write_bytes(struct.pack("<Q", len(header)) + header.encode() + b"\0" * 16)
    for name, words in [
        ("zero.pth", "not a regular file"),
        ("fifo.pth", "not a regular file"),
        ("nested.pth", "not a readable checkpoint"),
        ("huge.safetensors", "not a readable safetensors file"),
    ]:
        result = run(
            [sys.executable, "-m", "export", str(tmp_path / name), "--arch", fx.ARCH, "--no-bento"], timeout=60
        )
        assert_one_line_error(result, name, words)


def _handoff_checkpoint(path: Path, **meta_changes) -> Path:
    from contract.preprocessing import Preprocessing
    from train.checkpoint import EMBEDDED_DIGITS, FORMAT, make_meta

    classes = [f"c{i}" for i in range(fx.CLASSES)]
    pre = Preprocessing(crop=32, resize=32, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    meta = {**make_meta(fx.ARCH, classes, pre, 1, EMBEDDED_DIGITS), **meta_changes}
    meta = {k: v for k, v in meta.items() if v is not None}

    torch.save({"format": FORMAT, "model": fx.fresh_model().state_dict(), "meta": meta}, path)
    return path


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"interpolation": None}, "incomplete meta, missing interpolation"),
        ({"image_size": "32"}, "meta.image_size"),
        ({"channels": 1}, "meta.channels"),
        ({"std": [0.0, 0.2, 0.2]}, "meta.std"),
        ({"classes": ["a", "b"], "num_classes": 2}, "meta.classes lists 2 names but the model has 7 outputs"),
    ],
)
def test_bad_meta_is_one_line_and_exit_2(change, needle, tmp_path):
    path = _handoff_checkpoint(tmp_path / "last.pt", **change)
    assert_one_line_error(export_cli(str(path), "--out", str(tmp_path / "out"), "--no-bento"), needle)
    assert not (tmp_path / "out").exists()


def test_image_size_contradicting_the_checkpoint_is_refused(tmp_path):
    path = _handoff_checkpoint(tmp_path / "last.pt")
    assert_one_line_error(export_cli(str(path), "--image-size", "64", "--no-bento"), "--image-size=64", "at 32")


def test_safetensors_only_is_not_checked_and_not_registered(checkpoints_dir, tmp_path):
    out, home = tmp_path / "weights", tmp_path / "home"
    result = export_cli(
        str(checkpoints_dir / "bare.pth"),
        "--arch",
        fx.ARCH,
        "--image-size",
        "32",
        "--formats",
        "safetensors",
        "--out",
        str(out),
        bento_home=home,
    )
    assert result.returncode == 0, result.stderr
    manifest = read_manifest(out)
    assert manifest["status"] == "not checked" and manifest["parity"]["pass"] is None
    assert "NOT CHECKED" in result.stdout and not (home / "models").exists()
    from contract.manifest import ManifestError
    from contract.manifest import read_manifest as serve_reads

    with pytest.raises(ManifestError, match="not checked"):
        serve_reads(out)


def test_keys_of_the_other_library_get_a_hint(tmp_path):
    """A bare name is torchvision's; weights that fit the other library's model of that name say so."""
    import timm
    import torchvision

    path = tmp_path / "weights.pth"
    torch.save(timm.create_model("efficientnet_b0", num_classes=fx.CLASSES).state_dict(), path)
    result = export_cli(str(path), "--arch", "efficientnet_b0", "--no-bento")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "these keys look like timm's efficientnet_b0: pass --arch timm/efficientnet_b0" in result.stderr
    torch.save(torchvision.models.efficientnet_b0(num_classes=fx.CLASSES).state_dict(), path)
    result = export_cli(str(path), "--arch", "timm/efficientnet_b0", "--no-bento")
    assert result.returncode == 2 and "these keys look like torchvision's efficientnet_b0" in result.stderr
    torch.save(timm.create_model("resnet26d", num_classes=fx.CLASSES).state_dict(), path)
    result = export_cli(str(path), "--arch", "resnet50", "--no-bento")
    assert result.returncode == 2 and "look like" not in result.stderr, "no hint where neither library fits"
