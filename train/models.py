"""The model factory shared by training and export: any torchvision classifier by name.

Export rebuilds a model from a checkpoint's `meta` (arch, num_classes, image_size) through this one
function, so the two stages cannot disagree about what an architecture name means.
"""

from __future__ import annotations

import torch.nn as nn
import torchvision


def available_architectures() -> list[str]:
    return torchvision.models.list_models(module=torchvision.models)


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
    if arch not in available_architectures():
        raise ValueError(f"--arch={arch!r} is not a torchvision classifier; try one of: resnet18, resnet50, "
                         f"mobilenet_v3_small, efficientnet_b0, convnext_tiny, vit_b_16 (all: torchvision.models.list_models())")


def build_model(arch: str, num_classes: int, image_size: int) -> nn.Module:
    """A randomly initialised classifier; nothing is ever downloaded."""
    check_arch(arch)
    return torchvision.models.get_model(arch, weights=None, num_classes=num_classes, **_arch_kwargs(arch, image_size))
