"""The train and evaluation transforms, side by side.

The evaluation transform is a contract: it is built from `Preprocessing` (contract/preprocessing.py), which the
checkpoint and the manifest carry, and serve reproduces it without torch, so a served model sees exactly
what validation saw.
"""

from __future__ import annotations

from torchvision import transforms as T

from contract.preprocessing import Preprocessing

_INTERPOLATIONS = {
    "nearest": T.InterpolationMode.NEAREST,
    "bilinear": T.InterpolationMode.BILINEAR,
    "bicubic": T.InterpolationMode.BICUBIC,
}


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
