"""What the serving benchmarks serve and send: a resnet18 export (or a Hugging Face ViT's) and JPEG views of real
photos."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]


def make_model(folder: Path, *export_flags: str) -> Path:
    import torch
    import torchvision

    torch.manual_seed(0)
    ckpt = folder / "resnet18.pth"
    torch.save({"arch": "resnet18", "state_dict": torchvision.models.resnet18().state_dict()}, ckpt)
    out = folder / "resnet18.export"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "export",
            str(ckpt),
            "--formats",
            "onnx",
            "--out",
            str(out),
            "--no-bento",
            *export_flags,
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return out


def make_hf_image_model(folder: Path, *export_flags: str, layers: int = 12) -> Path:
    """A Hugging Face ViT image classifier the size of DeiT-tiny (224 px, patches of 16, width 192, 12 layers, 3
    heads, 1000 labels, random weights) saved with its image processor by save_pretrained, exported with no flags."""
    import torch
    import transformers

    torch.manual_seed(0)
    trained = folder / "vit"
    # num_labels is PretrainedConfig's keyword argument, which the stubs do not declare
    config = transformers.ViTConfig(  # type: ignore[call-arg]
        image_size=224, patch_size=16, hidden_size=192, num_hidden_layers=layers, num_attention_heads=3,
        intermediate_size=768, num_labels=1000,
    )  # fmt: skip
    transformers.ViTForImageClassification(config).save_pretrained(trained)
    transformers.ViTImageProcessor(size={"height": 224, "width": 224}).save_pretrained(trained)
    out = folder / "vit.export"
    command = [sys.executable, "-m", "export", str(trained), "--formats", "onnx", "--out", str(out), "--no-bento"]
    subprocess.run([*command, *export_flags], cwd=ROOT, check=True, capture_output=True)
    return out


def make_int8_model(folder: Path) -> Path:
    """make_model with --int8, calibrated and checked on 128 views of real photos (random weights: any drop)."""
    samples = write_jpegs(folder / "samples", 128)
    return make_model(folder, "--int8", "--samples", str(samples), "--max-accuracy-drop", "100")


def make_jpegs(count: int = 32) -> list[bytes]:
    """Real photos (scikit-learn's samples), cut into varied 400x300 views, as JPEG bytes."""
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(0)
    photos = [Image.fromarray(img) for img in load_sample_images().images]
    out = []
    for i in range(count):
        photo = photos[i % len(photos)]
        left, top = int(rng.integers(0, photo.width - 400)), int(rng.integers(0, photo.height - 300))
        buffer = io.BytesIO()
        photo.crop((left, top, left + 400, top + 300)).save(buffer, format="JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


PHONE_PHOTO_SIZE = (4032, 3024)  # a 12-megapixel phone photo


def phone_photos(count: int = 6) -> list[bytes]:
    """Real photos (scikit-learn's samples) scaled up past 12 megapixels and cut into varied 4032 x 3024 views,
    as JPEG bytes (quality 90, 0.7-1.4 MB each)."""
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(0)
    photos = [Image.fromarray(img) for img in load_sample_images().images]
    width, height = PHONE_PHOTO_SIZE
    out = []
    for i in range(count):
        scale = 1.3 + 0.2 * rng.random()
        big = photos[i % len(photos)].resize((int(width * scale), int(height * scale)), Image.Resampling.BICUBIC)
        left, top = int(rng.integers(0, big.width - width)), int(rng.integers(0, big.height - height))
        buffer = io.BytesIO()
        big.crop((left, top, left + width, top + height)).save(buffer, "JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def write_jpegs(folder: Path, count: int) -> Path:
    """`count` JPEG views (make_jpegs) as files in `folder`: calibration and check images for --int8."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, data in enumerate(make_jpegs(count)):
        (folder / f"{i:03d}.jpg").write_bytes(data)
    return folder


def workload_name(export: Path | None, *variants: str) -> str:
    """A result's workload: the export given with --export (none: the benchmark's default model) and the variants
    that are not the default (`int8`, `arrangements`), joined: `resnet18-32px-int8`, or "" for the default."""
    return "-".join(part for part in (export_workload(export) if export else "", *variants) if part)


def export_workload(folder: Path) -> str:
    """What an export given with --export is, for its result's name: the model and, for an image model, the size
    its images are resized to (`resnet18-32px`, the demo's digits model, against the default `resnet18` at 224 px)."""
    sys.path.insert(0, str(ROOT))
    from contract.manifest import read_manifest_unchecked

    manifest = read_manifest_unchecked(folder)
    crop = (manifest.get("preprocess") or {}).get("crop")
    return f"{manifest['arch']}-{crop}px" if crop else str(manifest["arch"])
