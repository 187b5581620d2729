"""`python -m export` as a user runs it: real checkpoints in every common shape, real artifacts, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import checkpoint_fixtures as fx
import numpy as np
import onnxruntime as ort
import pytest
import torch
from conftest import ROOT, TRAIN
from conftest import run as run_cmd

from contract.manifest import MANIFEST, MANIFEST_FORMAT, read_manifest_unchecked, sha256_file

pytestmark = pytest.mark.xdist_group("export")  # its module fixtures stay on one worker

WRAPPED = {  # fixture -> wrapper prefixes the exporter must report as removed
    "bare.pth": [],
    "ddp.pth": ["module."],
    "dataparallel.pth": ["module."],
    "compiled.pth": ["_orig_mod."],
    "compiled_ddp.pth": ["module.", "_orig_mod."],
    "ddp_compiled.pth": ["module.", "_orig_mod."],
    "submodule_wrapped.pth": ["module."],
    "model_key.pth": [],
    "cuda3.pth": ["module."],
    "weights.safetensors": [],
}


@pytest.fixture(scope="module")
def bento_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bentoml")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    return fx.build_all(tmp_path_factory.mktemp("checkpoints"))


def export_cli(*args: str, bento_home: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "BENTOML_HOME": str(bento_home or ROOT / ".no-bento-home")}
    return subprocess.run(
        [sys.executable, "-m", "export", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def read_manifest(folder: Path) -> dict:
    return read_manifest_unchecked(folder)


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("export: error:"), result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def onnx_logits(folder: Path, batch: torch.Tensor) -> np.ndarray:
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": batch.numpy()})[0]


@pytest.mark.parametrize("name", sorted(WRAPPED))
def test_every_wrapper_shape_exports_with_parity(name: str, checkpoints, tmp_path: Path):
    out = tmp_path / "export"
    result = export_cli(
        str(checkpoints[name]),
        "--arch",
        fx.ARCH,
        "--image-size",
        str(fx.SIZE),
        "--formats",
        "onnx",
        "--out",
        str(out),
        "--no-bento",
    )
    assert result.returncode == 0, result.stderr
    manifest = read_manifest(out)
    assert sorted(manifest["source"]["removed_prefixes"]) == sorted(WRAPPED[name])
    assert manifest["num_classes"] == fx.CLASSES, "num_classes is read off the classifier weights"
    assert manifest["status"] == "passed" and manifest["parity"]["pass"]
    if name == "cuda3.pth":
        assert manifest["source"]["device_tags"] == ["cuda:3"]
        with pytest.raises(RuntimeError, match="CUDA"):  # the classic failure the exporter avoids
            torch.load(checkpoints[name], weights_only=True)
    # Our own check, not the exporter's: the ONNX file computes what the original module computes.
    x = torch.randn(3, 3, fx.SIZE, fx.SIZE)
    with torch.inference_mode():
        expected = fx.fresh_model()(x).numpy()
    np.testing.assert_allclose(onnx_logits(out, x), expected, atol=1e-4, rtol=1e-3)


def test_imagenet_example_and_lightning_need_no_flags(checkpoints, tmp_path: Path):
    result = export_cli(str(checkpoints["imagenet_example.pth.tar"]), "--formats", "onnx", "--no-bento")
    assert result.returncode == 0, result.stderr
    default_out = checkpoints["imagenet_example.pth.tar"].parent / "imagenet_example.pth.export"
    manifest = read_manifest(default_out)
    assert manifest["arch"] == fx.ARCH and manifest["source"]["container"] == "imagenet-example"
    assert manifest["input"]["shape"] == [-1, 3, 224, 224] and manifest["preprocess"]["resize"] == 256
    assert "scikit-learn sample photos" in manifest["parity"]["inputs_described"]

    out = tmp_path / "lightning"
    result = export_cli(
        str(checkpoints["lightning.ckpt"]), "--image-size", "32", "--formats", "onnx", "--out", str(out), "--no-bento"
    )
    assert result.returncode == 0, result.stderr
    manifest = read_manifest(out)
    assert manifest["source"]["removed_prefixes"] == ["model. (attribute prefix)"]
    assert manifest["source"]["ignored_keys"] == ["criterion.weight"]


def test_trainer_checkpoint_end_to_end(tmp_path: Path, bento_home: Path):
    run_dir = tmp_path / "run"
    trained = run_cmd([sys.executable, TRAIN, "--epochs", "1", "--workers", "0", "--out", str(run_dir)])
    assert trained.returncode == 0, trained.stderr
    result = export_cli(str(run_dir / "last.pt"), bento_home=bento_home)  # no flags at all
    assert result.returncode == 0, result.stderr
    out = run_dir / "last.export"
    manifest = read_manifest(out)
    assert manifest["format"] == MANIFEST_FORMAT and manifest["labels"] == [str(i) for i in range(10)]
    assert set(manifest["artifacts"]) == {"model.onnx", "model.pt2", "model.torchscript.pt", "model.safetensors"}
    for name, info in manifest["artifacts"].items():
        assert sha256_file(out / name) == info["sha256"] and (out / name).stat().st_size == info["bytes"]
    runs = {(r["artifact"], r["provider"]) for r in manifest["parity"]["results"]}
    assert runs == {("model.onnx", "CPUExecutionProvider"), ("model.pt2", "torch"), ("model.torchscript.pt", "torch")}
    assert manifest["parity"]["batch_sizes"] == [1, 2, 8]
    assert "digits validation images" in manifest["parity"]["inputs_described"]
    assert manifest["onnx"]["opset"] == 18
    # The ONNX file describes itself too.
    import onnx

    props = {p.key: p.value for p in onnx.load(str(out / "model.onnx")).metadata_props}
    assert json.loads(props["handoff.labels"]) == manifest["labels"]
    assert json.loads(props["handoff.preprocess"]) == manifest["preprocess"]
    # Compare the ONNX output with the eager model ourselves, on real digits at several batch sizes.
    from PIL import Image

    from harness.reference import eager_from_export
    from train.data import digits_split

    model, transform = eager_from_export(out)
    _, (x_val, y_val) = digits_split()
    batch = torch.stack([transform(Image.fromarray(img).convert("RGB")) for img in x_val[:13]])
    with torch.inference_mode():
        expected = model(batch).numpy()
    got = onnx_logits(out, batch)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-3)
    assert (got.argmax(1) == expected.argmax(1)).all()
    # Registered in the BentoML model store.
    env = {**os.environ, "BENTOML_HOME": str(bento_home)}
    listed = subprocess.run(
        [sys.executable, "-m", "bentoml", "models", "list", "handoff", "-o", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "handoff:" in listed.stdout, listed.stdout + listed.stderr


def test_fp16_export_uses_fp16_tolerances(checkpoints, tmp_path: Path):
    out = tmp_path / "fp16"
    result = export_cli(
        str(checkpoints["bare.pth"]),
        "--arch",
        fx.ARCH,
        "--image-size",
        "32",
        "--fp16",
        "--formats",
        "onnx,torchscript",
        "--out",
        str(out),
        "--no-bento",
    )
    assert result.returncode == 0, result.stderr
    manifest = read_manifest(out)
    assert manifest["input"]["dtype"] == "float16"
    assert manifest["parity"]["tolerance"]["atol"] == 5e-2
    errors = [r["max_abs_error"] for r in manifest["parity"]["results"]]
    assert all(0 < e < 5e-2 for e in errors), errors  # real fp16 rounding, within bounds


def test_provoked_parity_failure_exits_3_and_marks_folder(checkpoints, tmp_path: Path, bento_home: Path):
    out = tmp_path / "strict"
    result = export_cli(
        str(checkpoints["bare.pth"]),
        "--arch",
        fx.ARCH,
        "--image-size",
        "32",
        "--atol",
        "0",
        "--rtol",
        "0",
        "--formats",
        "onnx",
        "--out",
        str(out),
        "--name",
        "never-registered",
        bento_home=bento_home,
    )
    assert result.returncode == 3, result.stderr
    assert "parity FAILED" in result.stderr
    manifest = read_manifest(out)
    assert manifest["status"] == "failed" and not manifest["parity"]["pass"]
    assert manifest["parity"]["results"][0]["max_abs_error"] > 0
    from contract.manifest import ManifestError
    from contract.manifest import read_manifest as serve_reads

    with pytest.raises(ManifestError, match="parity did not pass"):
        serve_reads(out)
    assert not (bento_home / "models" / "never-registered").exists()


def test_wrong_arch_prints_a_readable_diff(checkpoints, tmp_path: Path):
    out = tmp_path / "never"
    result = export_cli(
        str(checkpoints["ddp.pth"]), "--arch", "resnet34", "--image-size", "32", "--out", str(out), "--no-bento"
    )
    assert result.returncode == 2
    assert "missing: layer1.2.conv1.weight" in result.stderr and "did you pass the right --arch" in result.stderr
    assert "Traceback" not in result.stderr and not out.exists()


def test_refuses_pickles_without_trust_pickle(checkpoints, tmp_path: Path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save({"state_dict": fx.fresh_model().state_dict(), "payload": fx.RunsACommand(marker)}, evil)
    result = export_cli(str(evil), "--arch", fx.ARCH, "--out", str(tmp_path / "out"), "--no-bento")
    assert_one_line_error(result, "posix.system", "--trust-pickle")
    assert not marker.exists(), "the payload ran"
    assert not (tmp_path / "out").exists()

    pickled = checkpoints["pickled_dataparallel.pt"]
    assert_one_line_error(
        export_cli(str(pickled), "--no-bento", "--out", str(tmp_path / "no")), "--trust-pickle", "DataParallel"
    )
    out = tmp_path / "trusted"
    result = export_cli(
        str(pickled), "--trust-pickle", "--image-size", "32", "--formats", "onnx", "--out", str(out), "--no-bento"
    )
    assert result.returncode == 0, result.stderr
    assert read_manifest(out)["num_classes"] == fx.CLASSES


@pytest.mark.parametrize("damage", ["missing", "empty", "text", "truncated", "zeros"])
def test_damaged_input_is_one_line_and_exit_2(damage: str, checkpoints, tmp_path: Path):
    path = tmp_path / "model.pth"
    good = checkpoints["ddp.pth"].read_bytes()
    content = {
        "missing": None,
        "empty": b"",
        "text": b"hello, I am not a checkpoint\n",
        "truncated": good[: len(good) // 2],
        "zeros": bytes(4096),
    }[damage]
    if content is not None:
        path.write_bytes(content)
    out = tmp_path / "out"
    result = export_cli(str(path), "--arch", fx.ARCH, "--out", str(out), "--no-bento")
    assert_one_line_error(result, str(path))
    assert not out.exists(), "nothing half-written"
    assert not list(tmp_path.glob(".out.tmp*"))


def test_usage_errors(checkpoints, tmp_path: Path):
    bare = str(checkpoints["bare.pth"])
    assert_one_line_error(export_cli(bare, "--no-bento"), "does not name its architecture", "--arch")
    assert_one_line_error(export_cli(bare, "--arch", "resnet19", "--no-bento"), "not a torchvision classifier")
    assert_one_line_error(export_cli(bare, "--arch", fx.ARCH, "--formats", "tflite", "--no-bento"), "--formats")
    for flag, value in (("--image-size", "0"), ("--atol", "-1"), ("--labels", str(tmp_path / "missing.txt"))):
        assert_one_line_error(export_cli(bare, "--arch", fx.ARCH, flag, value, "--no-bento"), flag)
    for names, words in ((["cat", "dog", "cat"], "repeats class 0"), (["cat", "", "dog"], "is empty")):
        labels = tmp_path / "labels.txt"
        labels.write_text("\n".join(names) + "\n")
        assert_one_line_error(export_cli(bare, "--arch", fx.ARCH, "--labels", str(labels), "--no-bento"), words)
    assert_one_line_error(export_cli(bare, "--arch", fx.ARCH, "--labels", "/dev/zero", "--no-bento"), "no such file")
    if not torch.cuda.is_available():
        assert_one_line_error(export_cli(bare, "--arch", fx.ARCH, "--device", "cuda", "--no-bento"), "no CUDA")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_parity_on_cuda(checkpoints, tmp_path: Path):
    out = tmp_path / "cuda"
    result = export_cli(
        str(checkpoints["cuda3.pth"]),
        "--arch",
        fx.ARCH,
        "--image-size",
        "32",
        "--device",
        "cuda",
        "--out",
        str(out),
        "--no-bento",
    )
    assert result.returncode == 0, result.stderr
    providers = {r["provider"] for r in read_manifest(out)["parity"]["results"]}
    assert "CUDAExecutionProvider" in providers


def test_big_models_store_onnx_weights_as_external_data(tmp_path: Path):
    """Above the threshold (1 GiB by default; lowered here) the weights go to model.onnx.data."""
    from export.exporters import classifier_call, export_onnx

    model = fx.fresh_model()
    result = export_onnx(
        model,
        classifier_call(torch.randn(2, 3, fx.SIZE, fx.SIZE)),
        tmp_path / "model.onnx",
        {"handoff.arch": fx.ARCH},
        external_data_bytes=0,
    )
    assert result["external_data"] and result["files"] == ["model.onnx", "model.onnx.data"]
    assert (tmp_path / "model.onnx").stat().st_size < 1_000_000 < (tmp_path / "model.onnx.data").stat().st_size
    x = torch.randn(3, 3, fx.SIZE, fx.SIZE)
    with torch.inference_mode():
        expected = model(x).numpy()
    np.testing.assert_allclose(onnx_logits(tmp_path, x), expected, atol=1e-4, rtol=1e-3)


def test_out_replaces_only_an_export_and_a_failed_attempt_keeps_the_good_one(checkpoints, tmp_path: Path):
    bare = str(checkpoints["bare.pth"])
    common = ("--arch", fx.ARCH, "--image-size", "32", "--formats", "onnx", "--no-bento")
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("not an export")
    assert_one_line_error(export_cli(bare, *common, "--out", str(precious)), "not an export folder")
    assert (precious / "notes.txt").read_text() == "not an export"
    run_dir = checkpoints["bare.pth"].parent  # the checkpoint's own folder, never replaced
    assert_one_line_error(export_cli(bare, *common, "--out", str(run_dir)), "holds the checkpoint")
    assert checkpoints["bare.pth"].is_file()

    out = tmp_path / "good"
    assert export_cli(bare, *common, "--out", str(out)).returncode == 0
    good = sha256_file(out / MANIFEST)
    failed = export_cli(bare, *common, "--out", str(out), "--atol", "0", "--rtol", "0")
    assert failed.returncode == 3
    assert sha256_file(out / MANIFEST) == good, "the passing export survives the failed attempt"
    assert read_manifest(tmp_path / "good.failed")["status"] == "failed"
    assert "good.failed" in failed.stderr
    assert export_cli(bare, *common, "--out", str(out)).returncode == 0  # an export is replaced by a new one
    assert not list(tmp_path.glob(".good.*")), "no temporaries left"


def test_a_folder_that_appears_at_out_during_the_export_is_left_alone(checkpoints, tmp_path: Path):
    """Security round 3, item 11: a folder that is not an export, put at --out after the export checked it, was
    deleted by the replace. Now it is moved aside, checked there and put back: exit 2, its files untouched."""
    out = tmp_path / "late"
    command = [sys.executable, "-m", "export", str(checkpoints["bare.pth"]), "--arch", fx.ARCH, "--image-size", "32"]
    env = {**os.environ, "BENTOML_HOME": str(ROOT / ".no-bento-home")}
    with subprocess.Popen(
        [*command, "--formats", "onnx", "--no-bento", "--out", str(out)],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    ) as export:
        deadline = time.monotonic() + 300
        while not list(tmp_path.glob(".late.tmp.*")) and export.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)  # the staging folder appears once --out has been checked
        out.mkdir()
        (out / "notes.txt").write_text("not an export")
        _, stderr = export.communicate(timeout=300)
    assert export.returncode == 2, stderr
    assert "appeared there during the export" in stderr and "Traceback" not in stderr
    assert (out / "notes.txt").read_text() == "not an export" and sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert not list(tmp_path.glob(".late.*")), "no temporaries left"
