"""The model factory shared by training and export: torchvision's classifiers and timm's models.

A bare name (`resnet50`) means torchvision's model; `timm/NAME` (`timm/convnext_atto`) means
`timm.create_model(NAME)`. Where a name exists in both libraries, the bare one stays torchvision's.
Export rebuilds a model from a checkpoint's `meta` through these functions, so the two stages cannot
disagree about what an architecture name means, or about the evaluation preprocessing it defaults to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch.nn as nn
import torchvision

from contract.preprocessing import IMAGENET_MEAN, IMAGENET_STD

TIMM_PREFIX = "timm/"
TORCHVISION_CROP_PCT = 0.875  # torchvision's references: resize 256 for a 224 crop


@dataclass(frozen=True)
class EvalDefaults:
    """An architecture's own evaluation preprocessing, used wherever the checkpoint or the user says nothing."""

    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str
    crop_pct: float
    library: str  # torchvision | timm

    def resize_for(self, image_size: int) -> int:
        """Shorter side before the center crop: size / crop_pct, floored as timm does, rounded as handoff
        always has for torchvision models (256 for 224 either way)."""
        resize = image_size / self.crop_pct
        return max(image_size, math.floor(resize) if self.library == "timm" else round(resize))


def is_timm(arch: str) -> bool:
    return arch.startswith(TIMM_PREFIX)


def timm_name(arch: str) -> str:
    return arch[len(TIMM_PREFIX) :]


def available_architectures() -> list[str]:
    return torchvision.models.list_models(module=torchvision.models)


def timm_has(name: str) -> bool:
    import timm

    return timm.is_model(name)


def _arch_kwargs(arch: str, image_size: int) -> dict:
    """Constructor arguments some architectures need to be a plain single-output classifier at this size."""
    if arch in ("googlenet", "inception_v3"):
        return {"aux_logits": False, "init_weights": True}
    if arch.startswith("vit_"):
        return {"image_size": image_size}
    if arch == "maxvit_t":
        return {"input_size": (image_size, image_size)}
    return {}


def check_arch(arch: str) -> None:
    if is_timm(arch):
        if not timm_has(timm_name(arch)):
            raise ValueError(f"--arch={arch!r}: timm has no model {timm_name(arch)!r} (see timm.list_models())")
        return
    if arch not in available_architectures():
        hint = f"; timm has one: --arch timm/{arch}" if timm_has(arch) else ""
        raise ValueError(
            f"--arch={arch!r} is not a torchvision classifier{hint}; try one of: resnet18, resnet50, "
            "mobilenet_v3_small, efficientnet_b0, convnext_tiny, vit_b_16, or timm/NAME "
            "(all: torchvision.models.list_models(), timm.list_models())"
        )


def _timm_model(name: str, num_classes: int, image_size: int | None) -> nn.Module:
    import timm

    if image_size is not None:
        # Transformers take their input size as a constructor argument; convolutional models take any size.
        try:
            return timm.create_model(name, pretrained=False, num_classes=num_classes, img_size=image_size)
        except TypeError:
            pass
    return timm.create_model(name, pretrained=False, num_classes=num_classes)


def build_model(arch: str, num_classes: int, image_size: int) -> nn.Module:
    """A randomly initialised classifier; nothing is ever downloaded."""
    check_arch(arch)
    if is_timm(arch):
        return _timm_model(timm_name(arch), num_classes, image_size)
    return torchvision.models.get_model(arch, weights=None, num_classes=num_classes, **_arch_kwargs(arch, image_size))


def eval_defaults(arch: str | None) -> EvalDefaults:
    """timm/NAME: the model's resolved data config; anything else (torchvision, a user's own model):
    ImageNet statistics, bilinear, 224 px, crop 0.875."""
    if arch is None or not is_timm(arch):
        return EvalDefaults(224, IMAGENET_MEAN, IMAGENET_STD, "bilinear", TORCHVISION_CROP_PCT, "torchvision")
    import timm
    from timm.data import resolve_data_config

    check_arch(arch)
    pretrained_cfg = timm.get_pretrained_cfg(timm_name(arch))
    config = resolve_data_config({}, pretrained_cfg=pretrained_cfg.to_dict() if pretrained_cfg else {})
    if config.get("crop_mode", "center") != "center":
        raise ValueError(f"{arch}: timm's crop_mode {config['crop_mode']!r} is not supported (only 'center')")
    return EvalDefaults(
        int(config["input_size"][-1]),
        tuple(config["mean"]),
        tuple(config["std"]),
        str(config["interpolation"]),
        float(config["crop_pct"]),
        "timm",
    )
