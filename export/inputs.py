"""Parity inputs: real images through the model's own preprocessing, plus random tensors."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from contract.preprocessing import Preprocessing
from train.checkpoint import EMBEDDED_DIGITS
from train.presets import eval_transform

log = logging.getLogger(__name__)

REAL_IMAGES = 16  # real images parity (and the fast-decode check) run on, at most
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff"}


def image_files(folder: Path) -> list[Path]:
    """The images under `folder`, in name order."""
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)


def load_images(files: list[Path]) -> list[Image.Image]:
    return [Image.open(p).convert("RGB") for p in files]


def sample_images(samples: Path, limit: int) -> list[Image.Image]:
    """--samples: the first `limit` images of the folder, in name order; ValueError where it holds none."""
    files = image_files(samples)[:limit]
    if not files:
        raise ValueError(f"--samples={samples}: no images found (looked for {', '.join(sorted(IMAGE_SUFFIXES))})")
    return load_images(files)


def eval_transform_of(preprocess: dict[str, Any]) -> Any:
    """The torchvision evaluation transform a manifest's `preprocess` block describes."""
    return eval_transform(Preprocessing.from_manifest(preprocess))


def real_images(
    data: str | None, samples: Path | None, limit: int, val_split: str | None = None
) -> tuple[list[Image.Image], str]:
    """Real images for parity: --samples, else the validation images of the data the training script named
    (handoff's digits; torchvision references' data_path/val; timm's data_dir/<val_split>), else scikit-learn's
    two sample photos."""
    if samples is not None:
        return sample_images(samples, limit), str(samples)
    if data == EMBEDDED_DIGITS:
        from train.data import digits_split

        (_, _), (x_val, _) = digits_split()
        return [Image.fromarray(img).convert("RGB") for img in x_val[:limit]], "digits validation images"
    for split in (val_split, "val", "validation"):  # the script's own split name, then the usual ones
        if data and split and (Path(data) / split).is_dir() and image_files(Path(data) / split):
            return real_images(None, Path(data) / split, limit)
    from sklearn.datasets import load_sample_images  # two real photos that ship with scikit-learn

    return [Image.fromarray(img) for img in load_sample_images().images], "scikit-learn sample photos"


def parity_inputs(
    preprocess: dict[str, Any], images: list[Image.Image], origin: str, random: int = 16, seed: int = 0
) -> tuple[torch.Tensor, str]:
    """The real `images` (from `real_images`) through the model's own preprocessing, plus `random` noise inputs."""
    transform = eval_transform_of(preprocess)
    real_batch = torch.stack([transform(img) for img in images])
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn((random, *real_batch.shape[1:]), generator=generator)
    log.info("parity inputs: %d real (%s) + %d random", len(images), origin, random)
    return torch.cat([real_batch, noise]), f"{len(images)} real ({origin}) + {random} random"
