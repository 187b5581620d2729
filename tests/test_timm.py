"""timm models end to end: trained by torchrun, exported with timm's preprocessing, served; a ViT through ONNX;
the service's preprocessing against timm's own evaluation transform."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import Server, classify, digit_images, eager_from_export, eager_top1, png_bytes, run, torchrun_cmd
from PIL import Image
from test_export import export_cli, onnx_logits, read_manifest

from train.checkpoint import load


def test_a_timm_model_trained_with_ddp_exported_and_served(tmp_path):
    run_dir = tmp_path / "run"
    trained = run(
        torchrun_cmd(
            2,
            "--arch",
            "timm/resnet18d",
            "--image-size",
            "32",
            "--epochs",
            "1",
            "--batch-size",
            "32",
            "--workers",
            "0",
            "--out",
            str(run_dir),
        )
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    meta = load(run_dir / "last.pt")["meta"]
    # The arch with its prefix, and timm's data config for resnet18d where the user set nothing.
    assert meta["arch"] == "timm/resnet18d" and meta["interpolation"] == "bicubic" and meta["world_size"] == 2
    result = export_cli(str(run_dir / "last.pt"), "--no-bento")  # no flags
    assert result.returncode == 0, result.stderr
    out = run_dir / "last.export"
    assert read_manifest(out)["preprocess"]["interpolation"] == "bicubic"
    images, _ = digit_images(30)
    expected = eager_top1(eager_from_export(out), images)
    with Server(tmp_path / "serve.log", HANDOFF_MODEL_DIR=str(out)) as srv:
        srv.wait_ready()
        served = [classify(srv.url, png_bytes(img)).json()["predictions"][0]["index"] for img in images]
    assert served == expected


def test_a_vision_transformer_through_onnx_with_parity(tmp_path):
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", num_classes=7, img_size=32).eval()
    path = tmp_path / "vit.pth"
    torch.save(model.state_dict(), path)
    out = tmp_path / "vit.export"
    result = export_cli(
        str(path),
        "--arch",
        "timm/vit_tiny_patch16_224",
        "--image-size",
        "32",
        "--formats",
        "onnx",
        "--out",
        str(out),
        "--no-bento",
    )
    assert result.returncode == 0, result.stderr
    manifest = read_manifest(out)
    assert manifest["parity"]["pass"] and manifest["preprocess"]["mean"] == [0.5, 0.5, 0.5]
    x = torch.randn(4, 3, 32, 32)
    with torch.inference_mode():
        expected = model(x).numpy()
    np.testing.assert_allclose(onnx_logits(out, x), expected, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("arch", ["timm/resnet18d", "timm/vit_tiny_patch16_224", "timm/resnet50"])
def test_service_preprocessing_is_timms_eval_transform(arch):
    """The manifest's preprocessing for a timm model, run by the service's torch-free Preprocessor, gives
    exactly what timm's own create_transform(..., is_training=False) gives, on real photos."""
    import timm
    from sklearn.datasets import load_sample_images
    from timm.data import create_transform, resolve_data_config

    from contract.pil_transform import Preprocessor
    from export.architecture import _preprocess
    from export.readers.containers import Source

    name = arch.removeprefix("timm/")
    preprocess = _preprocess(Source(Path("x"), "", "state_dict", {}), arch, None)
    config = resolve_data_config({}, model=timm.create_model(name, pretrained=False))
    theirs = create_transform(**config, is_training=False)
    ours = Preprocessor.from_manifest(preprocess, max_pixels=10**9)
    photos = [Image.fromarray(img) for img in load_sample_images().images]
    photos.append(photos[1].crop((0, 0, 300, 420)))  # portrait
    for photo in photos:
        np.testing.assert_allclose(ours(photo), theirs(photo).numpy(), atol=1e-6)
