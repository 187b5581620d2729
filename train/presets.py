"""The train and evaluation transforms, side by side.

The evaluation transform is a contract: export and serve reproduce it from `Preprocessing.to_meta()`,
which the checkpoint carries, so a served model sees exactly what validation saw.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from torchvision import transforms as T

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_INTERPOLATIONS = {
    "nearest": T.InterpolationMode.NEAREST,
    "bilinear": T.InterpolationMode.BILINEAR,
    "bicubic": T.InterpolationMode.BICUBIC,
}


@dataclass(frozen=True)
class Preprocessing:
    """How an image becomes the model's input at evaluation time."""

    crop: int  # the square the model sees (the checkpoint's `image_size`)
    resize: int  # shorter side resized to this before the center crop
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    interpolation: str = "bilinear"
    channels: int = 3

    def __post_init__(self) -> None:
        if self.interpolation not in _INTERPOLATIONS:
            raise ValueError(f"interpolation={self.interpolation!r}: choose one of {sorted(_INTERPOLATIONS)}")
        if self.resize < self.crop:
            raise ValueError(f"resize={self.resize} is smaller than the crop {self.crop}")

    def to_meta(self) -> dict:
        meta = asdict(self)
        meta["mean"], meta["std"] = list(self.mean), list(self.std)
        return meta


def eval_transform(pre: Preprocessing) -> T.Compose:
    return T.Compose(
        [
            T.Resize(pre.resize, interpolation=_INTERPOLATIONS[pre.interpolation], antialias=True),
            T.CenterCrop(pre.crop),
            T.ToTensor(),
            T.Normalize(pre.mean, pre.std),
        ]
    )


def train_transform(pre: Preprocessing, min_scale: float, hflip: float) -> T.Compose:
    """Random crops (scale from `min_scale`) and optional horizontal flips, then the eval normalisation."""
    steps = [
        T.RandomResizedCrop(
            pre.crop, scale=(min_scale, 1.0), interpolation=_INTERPOLATIONS[pre.interpolation], antialias=True
        )
    ]
    if hflip > 0:
        steps.append(T.RandomHorizontalFlip(hflip))
    steps += [T.ToTensor(), T.Normalize(pre.mean, pre.std)]
    return T.Compose(steps)
