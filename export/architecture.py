"""Which model the weights belong to, and how its inputs are prepared.

Architecture: `--model module:factory` or `--arch NAME` when given, else what the checkpoint says
(handoff's meta, the ImageNet example's `arch`, Lightning's `hyper_parameters`). `num_classes` is read
off the classifier weights, so a 10-class resnet18 needs no flag beyond its name.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn

from export.manifest import preprocess_from_meta
from export.sources import Source
from export.unwrap import Unwrapped, unwrap_keys
from train.models import build_model, check_arch
from train.presets import IMAGENET_MEAN, IMAGENET_STD

log = logging.getLogger(__name__)
_PROBE_CLASSES = 1013  # an unlikely class count, so the classifier's tensors are easy to spot


@dataclass
class ModelSpec:
    arch: str
    num_classes: int
    classes: list[str]
    preprocess: dict[str, Any]
    model: nn.Module  # weights not loaded yet (unless it came pickled)
    unwrapped: Unwrapped


def _user_factory(spec: str) -> Callable[..., nn.Module]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"--model={spec!r}: expected module:factory, e.g. mypkg.nets:build_net")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"--model={spec!r}: cannot import it ({err})") from None


def _call_factory(factory: Callable[..., nn.Module], num_classes: int | None) -> nn.Module:
    accepts = "num_classes" in inspect.signature(factory).parameters
    return factory(num_classes=num_classes) if accepts and num_classes is not None else factory()


def resolve_arch(src: Source, arch_flag: str | None) -> str:
    if arch_flag and src.arch and arch_flag != src.arch:
        log.warning("--arch %s overrides the checkpoint's own %r", arch_flag, src.arch)
    arch = arch_flag or src.arch
    if arch is None:
        raise ValueError(f"{src.path}: the checkpoint ({src.kind}) does not name its architecture; "
                         "pass --arch NAME (a torchvision classifier) or --model module:factory")
    check_arch(arch)
    return arch


def _image_size(src: Source, flag: int | None) -> int:
    hp = src.hyper_parameters or {}
    return flag or (src.meta or {}).get("image_size") or hp.get("image_size") or 224


def _default_preprocess(image_size: int) -> dict[str, Any]:
    return {"resize": round(image_size / 0.875), "crop": image_size, "mean": list(IMAGENET_MEAN),
            "std": list(IMAGENET_STD), "interpolation": "bilinear", "channels": 3}


def resolve_model(src: Source, arch_flag: str | None, model_flag: str | None, image_size_flag: int | None,
                  labels: list[str] | None) -> ModelSpec:
    """Build the target module and map the checkpoint's keys onto it."""
    image_size = _image_size(src, image_size_flag)
    if src.module is not None and not (arch_flag or model_flag):
        model, arch = src.module, type(src.module).__name__
        make = None
    elif model_flag:
        factory = _user_factory(model_flag)
        arch = model_flag
        make = lambda n: _call_factory(factory, n)  # noqa: E731
    else:
        arch = resolve_arch(src, arch_flag)
        make = lambda n: build_model(arch, n, image_size)  # noqa: E731

    if make is not None:
        with torch.device("meta"):  # no memory, no init cost: only names and shapes are needed
            probe = make(_PROBE_CLASSES)
        probe_state = probe.state_dict()
        unwrapped = unwrap_keys(src.state_dict, set(probe_state))
        classifier = [k for k, t in probe_state.items() if t.ndim >= 1 and t.shape[0] == _PROBE_CLASSES]
        found = [unwrapped.state_dict[k].shape[0] for k in classifier if k in unwrapped.state_dict]
        num_classes = found[0] if found else (src.meta or {}).get("num_classes")
        if num_classes is None:
            raise ValueError(f"{src.path}: cannot tell the number of classes: no classifier weights "
                             f"({', '.join(classifier) or 'none found'}) in the checkpoint for {arch}")
        model = make(num_classes)
    else:
        unwrapped = unwrap_keys(src.state_dict, set(model.state_dict()))
        with torch.inference_mode():  # a pickled model says its class count only through its output
            num_classes = model.eval()(torch.zeros(1, 3, image_size, image_size)).shape[1]

    classes = _classes(src, labels, num_classes)
    num_classes = len(classes)
    preprocess = preprocess_from_meta(src.meta) if src.meta else _default_preprocess(image_size)
    return ModelSpec(arch, num_classes, classes, preprocess, model, unwrapped)


def _classes(src: Source, labels: list[str] | None, num_classes: int) -> list[str]:
    if labels is not None:
        if len(labels) != num_classes:
            raise ValueError(f"--labels lists {len(labels)} names but the model has {num_classes} outputs")
        return labels
    if src.meta and src.meta.get("classes"):
        return [str(c) for c in src.meta["classes"]]
    return [str(i) for i in range(num_classes)]
