"""How an image becomes the model's input at evaluation time: the one description all three stages share.

The trainer writes it into the checkpoint's `meta` (where the crop is called `image_size`), export reads it
from there and writes it as the manifest's `preprocess` block, and the service reads it from the manifest.
`to_meta`/`from_meta` and `to_manifest`/`from_manifest` are the only writers and readers. Plain Python,
no torch: the service imports it (train/presets.py builds the torchvision transform from it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INTERPOLATIONS = ("nearest", "bilinear", "bicubic")
# How the image is resized: its shorter side to `resize` (torchvision's Resize(int), the aspect kept), or the whole
# image to `resize` x `resize` (a Hugging Face image processor's {"height", "width"}: ViT, DeiT, BEiT, Swin).
RESIZE_MODES = ("shorter", "exact")
# Where a center crop of an odd margin starts: torchvision's CenterCrop rounds half the margin (to even), a
# Hugging Face image processor floors it; a photo whose margin is 2k+1 with k odd is cropped one pixel apart.
CROP_OFFSETS = ("round", "floor")


def check_image_size(size: int) -> None:
    """The --image-size rule, shared by the trainer and the exporter."""
    if size < 8:
        raise ValueError(f"--image-size={size}: use at least 8 pixels")


@dataclass(frozen=True)
class Preprocessing:
    """Resize the shorter side to `resize` (or the whole image to `resize` x `resize`), center-crop `crop` x `crop`,
    scale to [0, 1], normalise."""

    crop: int  # the square the model sees (the checkpoint meta's `image_size`)
    resize: int  # shorter side resized to this before the center crop
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    interpolation: str = "bilinear"
    channels: int = 3
    resize_mode: str = "shorter"
    crop_offset: str = "round"

    def __post_init__(self) -> None:
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation={self.interpolation!r}: choose one of {', '.join(INTERPOLATIONS)}")
        if self.resize_mode not in RESIZE_MODES:
            raise ValueError(f"resize_mode={self.resize_mode!r}: choose one of {', '.join(RESIZE_MODES)}")
        if self.crop_offset not in CROP_OFFSETS:
            raise ValueError(f"crop_offset={self.crop_offset!r}: choose one of {', '.join(CROP_OFFSETS)}")
        if self.resize < self.crop:
            raise ValueError(f"resize={self.resize} is smaller than the crop {self.crop}")

    def to_manifest(self) -> dict[str, Any]:
        return {
            "resize": self.resize,
            "crop": self.crop,
            "mean": list(self.mean),
            "std": list(self.std),
            "interpolation": self.interpolation,
            "channels": self.channels,
            "resize_mode": self.resize_mode,
            "crop_offset": self.crop_offset,
        }

    @classmethod
    def from_manifest(cls, block: dict[str, Any]) -> Preprocessing:
        return cls(
            int(block["crop"]),
            int(block["resize"]),
            tuple(float(v) for v in block["mean"]),
            tuple(float(v) for v in block["std"]),
            str(block["interpolation"]),
            int(block["channels"]),
            str(block.get("resize_mode", "shorter")),  # manifests and checkpoints before Hugging Face processors
            str(block.get("crop_offset", "round")),
        )

    def to_meta(self) -> dict[str, Any]:
        """The checkpoint meta's preprocessing fields (the trainer's transform is torchvision's: the shorter side
        resized, the crop's offsets rounded, which `from_meta` reads back)."""
        if (self.resize_mode, self.crop_offset) != ("shorter", "round"):
            raise ValueError("a training checkpoint's preprocessing is torchvision's: shorter side, rounded crop")
        block = self.to_manifest()
        del block["resize_mode"], block["crop_offset"]
        block["image_size"] = block.pop("crop")
        return block

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> Preprocessing:
        return cls.from_manifest({**meta, "crop": meta["image_size"]})
