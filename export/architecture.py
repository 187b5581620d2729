"""Which model the weights belong to, and how its inputs are prepared.

Architecture: `--model module:factory` or `--arch NAME` when given, else what the checkpoint says
(handoff's meta, torchvision references' `options.read.model`, timm's and the ImageNet example's `arch`, Lightning's
`hyper_parameters`). A bare name is torchvision's; timm's models are `timm/NAME` (a timm checkpoint's
`arch` is read as timm's). `num_classes` is read off the classifier weights, so a 10-class resnet18 needs
no flag beyond its name.

Preprocessing, first found wins: handoff's meta; what the training script's saved arguments say (crop,
resize, interpolation, mean, std); the architecture's own defaults (timm's data config for timm models).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from contract.preprocessing import Preprocessing
from export.provenance import Provenance, load_checked, trace
from export.readers.containers import Source
from export.unwrap import LoadMismatch, Unwrapped, unwrap_keys
from train.class_names import check_class_names
from train.models import TIMM_PREFIX, build_model, check_arch, eval_defaults, is_timm, timm_has, timm_name

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
    except Exception as err:  # noqa: BLE001 - the user's module raised while it was imported: one line, not a traceback
        raise ValueError(f"--model={spec!r}: importing it raised {type(err).__name__}: {err}") from None


def _call_factory(factory: Callable[..., nn.Module], num_classes: int | None) -> nn.Module:
    accepts = "num_classes" in inspect.signature(factory).parameters
    try:
        return factory(num_classes=num_classes) if accepts and num_classes is not None else factory()
    except Exception as err:  # noqa: BLE001 - the user's factory raised: say so in one line, exit 2
        raise ValueError(f"--model: calling {factory.__name__}() raised {type(err).__name__}: {err}") from None


def resolve_arch(src: Source, arch_flag: str | None) -> str:
    if arch_flag and src.arch and arch_flag != src.arch:
        log.warning("--arch %s overrides the checkpoint's own %r", arch_flag, src.arch)
    arch = arch_flag or src.arch
    if arch is None:
        raise ValueError(
            f"{src.path}: the checkpoint ({src.kind}) does not name its architecture; "
            "pass --arch NAME (a torchvision classifier or detector, or timm/NAME) or --model module:factory"
        )
    check_arch(arch)
    return arch


def other_library(arch: str) -> str | None:
    """The same name in the other library, where it exists there (resnet50 <-> timm/resnet50)."""
    if is_timm(arch):
        name = timm_name(arch)
        try:
            check_arch(name)
            return name
        except ValueError:
            return None
    return TIMM_PREFIX + arch if timm_has(arch) else None


def other_library_hint(arch: str, state: dict[str, torch.Tensor], image_size: int) -> str:
    """'these keys look like timm's NAME: pass --arch timm/NAME' where they fit the other library's model."""
    other = other_library(arch)
    if other is None or not fits(other, state, image_size):
        return ""
    library, name = ("timm", timm_name(other)) if is_timm(other) else ("torchvision", other)
    return f"these keys look like {library}'s {name}: pass --arch {other} (a bare name means torchvision's model)"


def fits(arch: str, state: dict[str, torch.Tensor], image_size: int) -> bool:
    """Whether `state` (wrapper prefixes included) loads into `arch` strictly, checked on the meta device."""
    with torch.device("meta"):
        probe = build_model(arch, _PROBE_CLASSES, image_size)
    own = probe.state_dict()
    mapped = unwrap_keys(state, set(own)).state_dict
    return mapped.keys() == own.keys() and all(
        mapped[k].shape == own[k].shape or (own[k].ndim >= 1 and own[k].shape[0] == _PROBE_CLASSES) for k in own
    )


def classes_in_heads(
    make: Callable[[int], nn.Module], state: dict[str, torch.Tensor], arch: str
) -> tuple[int, Unwrapped]:
    """The number of classes the weights were trained with, read off the model's heads: built on the meta device
    with _PROBE_CLASSES (prime), a head's tensor that counts classes has k x _PROBE_CLASSES channels (k anchors
    per place for a detector), and the checkpoint's has k x its own. Also the checkpoint's keys mapped onto it."""
    with torch.device("meta"):
        probe = make(_PROBE_CLASSES).state_dict()
    unwrapped = unwrap_keys(state, set(probe))
    for key, tensor in probe.items():
        if tensor.ndim and tensor.shape[0] % _PROBE_CLASSES == 0 and key in unwrapped.state_dict:
            return unwrapped.state_dict[key].shape[0] // (tensor.shape[0] // _PROBE_CLASSES), unwrapped
    raise ValueError(f"cannot tell the number of classes: no class head of {arch} found in the checkpoint")


def load_by_heads(
    make: Callable[[int], nn.Module],
    src: Source,
    arch: str,
    labels: list[str] | None,
    timings: dict[str, float],
    allow_partial: bool = False,
) -> tuple[nn.Module, Unwrapped, list[str], Provenance]:
    """A detector or segmenter built by `make(num_classes)` with the checkpoint's weights (every tensor, wrapper
    prefixes removed), in eval mode, its class names (`labels`, --labels, else the indices) and its provenance."""
    from export.steps import timed

    with timed(timings, "load"):
        num_classes, unwrapped = classes_in_heads(make, src.state_dict, arch)
        model = make(num_classes)
        loaded, tied = load_checked(model, unwrapped, arch, allow_partial)
        model = model.float().eval()
        provenance = trace(model, unwrapped, loaded, tied, arch, allow_partial)
    if labels is not None and len(labels) != num_classes:
        raise ValueError(f"--labels lists {len(labels)} names but {arch} has {num_classes} classes (background first)")
    return model, unwrapped, labels or [str(i) for i in range(num_classes)], provenance


def _image_size(src: Source, flag: int | None) -> int | None:
    """--image-size, unless it contradicts the size the checkpoint was trained at: then refuse."""
    recorded = (src.meta or {}).get("image_size") or src.preprocess_hints.get("image_size")
    if flag is not None and recorded is not None and flag != recorded:
        raise ValueError(
            f"--image-size={flag}: the checkpoint was trained and is preprocessed at {recorded}; "
            "drop --image-size (a model exported at another size than its preprocessing would "
            "see different pixels)"
        )
    return flag or recorded


def _preprocess(src: Source, arch: str | None, image_size: int | None) -> dict[str, Any]:
    if src.meta:
        return Preprocessing.from_meta(src.meta).to_manifest()
    hints = src.preprocess_hints
    defaults = eval_defaults(arch)
    defaults = dataclasses.replace(defaults, crop_pct=float(hints.get("crop_pct") or defaults.crop_pct))
    size = image_size or defaults.image_size
    resize = hints.get("resize") or defaults.resize_for(size)
    return {
        "resize": int(resize),
        "crop": int(size),
        "mean": [float(v) for v in hints.get("mean") or defaults.mean],
        "std": [float(v) for v in hints.get("std") or defaults.std],
        "interpolation": str(hints.get("interpolation") or defaults.interpolation),
        "channels": 3,
    }


def resolve_model(
    src: Source, arch_flag: str | None, model_flag: str | None, image_size_flag: int | None, labels: list[str] | None
) -> ModelSpec:
    """Build the target module and map the checkpoint's keys onto it."""
    image_size = _image_size(src, image_size_flag)
    build_size = image_size or 224
    if src.module is not None and not (arch_flag or model_flag):
        model, arch = src.module, type(src.module).__name__
        make = None
    elif model_flag:
        factory = _user_factory(model_flag)
        arch = model_flag
        make = lambda n: _call_factory(factory, n)  # noqa: E731
    else:
        arch = resolve_arch(src, arch_flag)
        build_size = image_size or eval_defaults(arch).image_size
        image_size = build_size
        make = lambda n: build_model(arch, n, build_size)  # noqa: E731

    if make is not None:
        with torch.device("meta"):  # no memory, no init cost: only names and shapes are needed
            probe = make(_PROBE_CLASSES)
        probe_state = probe.state_dict()
        unwrapped = unwrap_keys(src.state_dict, set(probe_state))
        classifier = [k for k, t in probe_state.items() if t.ndim >= 1 and t.shape[0] == _PROBE_CLASSES]
        found = [unwrapped.state_dict[k].shape[0] for k in classifier if k in unwrapped.state_dict]
        num_classes = found[0] if found else (src.meta or {}).get("num_classes")
        if num_classes is None:
            hint = other_library_hint(arch, src.state_dict, build_size) if not model_flag else ""
            raise ValueError(
                f"{src.path}: cannot tell the number of classes: no classifier weights "
                f"({', '.join(classifier) or 'none found'}) in the checkpoint for {arch}"
                + (f"; {hint}" if hint else "")
            )
        model = make(num_classes)
    else:
        unwrapped = unwrap_keys(src.state_dict, set(model.state_dict()))
        with torch.inference_mode():  # a pickled model says its class count only through its output
            num_classes = model.eval()(torch.zeros(1, 3, build_size, build_size)).shape[1]

    classes = _classes(src, labels, num_classes)
    preprocess = _preprocess(src, arch if make is not None and not model_flag else None, image_size)
    return ModelSpec(arch, num_classes, classes, preprocess, model, unwrapped)


def build_user_model(
    src: Source, model_flag: str, allow_partial: bool = False
) -> tuple[nn.Module, Unwrapped, Provenance]:
    """Your own module (`--model module:factory`, called with no arguments) with the checkpoint's weights,
    wrapper prefixes removed, every tensor accounted for: any other model than an image classifier."""
    factory = _user_factory(model_flag)
    try:
        model = factory()
    except TypeError as err:
        raise ValueError(f"--model={model_flag}: calling it with no arguments failed ({err})") from None
    except Exception as err:  # noqa: BLE001 - the user's factory raised: one line and exit 2, not a traceback
        raise ValueError(f"--model={model_flag}: calling it raised {type(err).__name__}: {err}") from None
    if not isinstance(model, nn.Module):
        raise ValueError(f"--model={model_flag}: returned {type(model).__name__}, not an nn.Module")
    state = src.module.state_dict() if src.module is not None else src.state_dict
    unwrapped = unwrap_keys(state, set(model.state_dict()))
    loaded, tied = load_checked(model, unwrapped, model_flag, allow_partial)
    model = model.eval()
    return model, unwrapped, trace(model, unwrapped, loaded, tied, model_flag, allow_partial)


def load_weights(
    spec: ModelSpec, src: Source, arch_is_a_name: bool, allow_partial: bool = False
) -> tuple[set[str], dict[str, str]]:
    """export/provenance.py's checked load (the keys loaded, the tied ones); when the keys do not fit but fit
    the same name in the other library, say so."""
    try:
        return load_checked(spec.model, spec.unwrapped, spec.arch, allow_partial)
    except LoadMismatch as err:
        hint = other_library_hint(spec.arch, src.state_dict, spec.preprocess["crop"]) if arch_is_a_name else ""
        if hint:
            raise LoadMismatch(f"{err}; {hint}") from None
        raise


def _classes(src: Source, labels: list[str] | None, num_classes: int) -> list[str]:
    if labels is not None:
        if len(labels) != num_classes:
            raise ValueError(f"--labels lists {len(labels)} names but the model has {num_classes} outputs")
        return labels
    if src.meta and src.meta.get("classes"):
        classes = check_class_names(src.meta["classes"], f"{src.path}: meta.classes")
        if len(classes) != num_classes:
            raise ValueError(
                f"{src.path}: meta.classes lists {len(classes)} names but the model has {num_classes} "
                "outputs; pass --labels with one name per output"
            )
        return classes
    return [str(i) for i in range(num_classes)]
