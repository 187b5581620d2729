"""Today's formats (torch.export's model.pt2, an AOTInductor package) and INT8 with its accuracy gate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import torch
from conftest import Server, classify, digit_images, eager_from_export, png_bytes
from test_export import export_cli, read_manifest

from contract.pil_transform import Preprocessor

pytestmark = pytest.mark.xdist_group("formats")  # its module fixtures stay on one worker


def checkpoint_of(folder: Path) -> str:
    return read_manifest(folder)["source"]["checkpoint"]


def test_pt2_is_in_the_default_set_and_loads_with_torch_alone(exported, tmp_path):
    manifest = read_manifest(exported)
    assert "model.pt2" in manifest["artifacts"]
    assert any(r["artifact"] == "model.pt2" and r["passed"] for r in manifest["parity"]["results"])
    model, transform = eager_from_export(exported)
    images, _ = digit_images(7)
    batch = torch.stack([transform(img) for img in images])
    np.save(tmp_path / "batch.npy", batch.numpy())
    # A separate interpreter in isolated mode, outside the checkout: torch and the file, nothing of handoff.
    script = (
        "import sys, numpy, torch; m = torch.export.load(sys.argv[1]).module(); "
        "x = torch.from_numpy(numpy.load(sys.argv[2])); numpy.save(sys.argv[3], m(x).detach().numpy())"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            script,
            str(exported / "model.pt2"),
            str(tmp_path / "batch.npy"),
            str(tmp_path / "out.npy"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    with torch.inference_mode():
        expected = model(batch).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), expected, atol=1e-5, rtol=1e-4)


def test_aoti_package_is_compiled_and_checked(exported, tmp_path):
    out = tmp_path / "aoti"
    result = export_cli(checkpoint_of(exported), "--formats", "aoti", "--out", str(out), "--no-bento")
    assert result.returncode == 0, result.stderr
    manifest = read_manifest(out)
    rows = {r["artifact"]: r for r in manifest["parity"]["results"]}
    assert rows["model.aoti.pt2"]["passed"] and rows["model.aoti.pt2"]["runtime"] == "aotinductor"
    assert manifest["parity"]["batch_sizes"] == [1, 2, 8]
    compiled = torch._inductor.aoti_load_package(str(out / "model.aoti.pt2"))
    model, transform = eager_from_export(exported)
    batch = torch.stack([transform(img) for img in digit_images(5)[0]])
    with torch.inference_mode():
        np.testing.assert_allclose(compiled(batch).numpy(), model(batch).numpy(), atol=1e-4, rtol=1e-3)


@pytest.fixture(scope="module")
def int8_export(exported, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("int8") / "export"
    result = export_cli(checkpoint_of(exported), "--formats", "onnx", "--int8", "--out", str(out), "--no-bento")
    assert result.returncode == 0, result.stderr
    return out


def test_int8_passes_its_gate_and_is_served_as_it_runs_in_process(int8_export, tmp_path):
    manifest = read_manifest(int8_export)
    int8 = manifest["int8"]
    assert int8["passed"] and int8["metric"] == "top-1 accuracy" and "digits validation set (360" in int8["evaluation"]
    assert int8["calibration"] == "256 digits training images" and int8["drop"] <= 1.0
    assert "model.int8.onnx" in manifest["artifacts"]
    images, _ = digit_images(30)
    pre = Preprocessor.from_manifest(manifest["preprocess"], max_pixels=10**8)
    session = ort.InferenceSession(str(int8_export / "model.int8.onnx"), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"input": np.stack([pre(pre.decode(png_bytes(img))) for img in images])})[0]
    with Server(tmp_path / "serve.log", HANDOFF_MODEL_DIR=str(int8_export), HANDOFF_PRECISION="int8") as srv:
        srv.wait_ready()
        info = httpx.get(f"{srv.url}/info", timeout=10).json()
        assert info["precision"] == "int8"
        assert info["model"]["sha256"] == manifest["artifacts"]["model.int8.onnx"]["sha256"]
        served = [classify(srv.url, png_bytes(img)).json()["predictions"][0]["index"] for img in images]
    assert served == expected.argmax(1).tolist()


def test_int8_gate_refuses_a_model_that_loses_accuracy(exported, tmp_path):
    """The same weights in a resnet18 with an outlier activation (tests/fixtures/outlier_model.py): exact in
    fp32, ruined by per-tensor INT8. Exit 3, marked failed, never served."""
    out = tmp_path / "outlier"
    result = export_cli(
        checkpoint_of(exported),
        "--model",
        "tests.fixtures.outlier_model:resnet18",
        "--formats",
        "onnx",
        "--int8",
        "--out",
        str(out),
        "--no-bento",
    )
    assert result.returncode == 3, result.stderr
    assert "INT8 accuracy gate FAILED" in result.stderr
    int8 = read_manifest(out)["int8"]
    assert not int8["passed"] and int8["drop"] > 1.0 and int8["fp32_top1"] > 50
    srv = Server(tmp_path / "serve.log", HANDOFF_MODEL_DIR=str(out), HANDOFF_PRECISION="int8")
    try:
        srv.wait_live()
        assert srv.status("/readyz") == 503
        assert "failed its accuracy gate" in httpx.get(f"{srv.url}/info", timeout=10).json()["reason"]
    finally:
        srv.stop()


def test_int8_asked_of_an_export_without_it_is_not_ready(exported, tmp_path):
    srv = Server(tmp_path / "serve.log", HANDOFF_MODEL_DIR=str(exported), HANDOFF_PRECISION="int8")
    try:
        srv.wait_live()
        assert srv.status("/readyz") == 503
        assert "no INT8 artifact" in httpx.get(f"{srv.url}/info", timeout=10).json()["reason"]
    finally:
        srv.stop()


def test_int8_needs_images_and_onnx(tmp_path):
    path = tmp_path / "bare.pth"
    import torchvision

    torch.save(torchvision.models.resnet18(num_classes=3).state_dict(), path)
    for flags, needle in (
        (("--int8",), "--samples"),
        (("--int8", "--formats", "pt2"), "keep onnx"),
        (("--int8", "--fp16"), "choose one precision"),
    ):
        result = export_cli(
            str(path), "--arch", "resnet18", "--image-size", "32", *flags, "--no-bento", "--out", str(tmp_path / "out")
        )
        assert result.returncode == 2 and needle in result.stderr, result.stderr
