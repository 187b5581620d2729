"""A Hugging Face image processor (`preprocessor_config.json`, saved with the model by Trainer or save_pretrained),
translated into handoff's preprocessing contract and proved against transformers' own processor.

transformers has two backends for each processor: PIL (`backend="pil"`), which the service reproduces exactly, and
torchvision (its default where torchvision is installed), whose uint8 resize rounds about one pixel value in a few
hundred differently from Pillow's. `check_processor` compares the served preprocessing with both on real photos and
sizes that exercise every step (odd crop margins, grayscale, tiny, wide): the PIL backend must match to float
rounding or the export is refused; the torchvision backend's difference, and what it does to the model's logits, is
measured and recorded (`preprocess_check` in the manifest). What a processor does that the contract cannot say (a
non-square size, padding, a channel flip, another rescale) is refused in one line.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from PIL import Image

from contract.pil_transform import Preprocessor
from contract.preprocessing import Preprocessing

RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # PIL's numbering, as processors save it
# ConvNeXT's processor resizes below this size to shortest_edge / crop_pct and crops; at or above, to the square
CONVNEXT_CROP_BELOW = 384
# Steps a processor may switch on that change nothing the service computes (labels of segmentation maps)
HARMLESS_STEPS = {"do_reduce_labels", "do_convert_rgb"}
EXACT = 1e-5  # the PIL backend against the service: float32 rounding of the same arithmetic


@dataclass(frozen=True)
class ProcessorCheck:
    """The served preprocessing against transformers' processor, on the same images (the manifest's
    `preprocess_check`)."""

    processor: str
    images: int
    max_difference_pil: float  # in normalised units: transformers' PIL backend, which must match
    max_difference_torchvision: float  # transformers' default backend, in 8-bit pixel values
    pixels_differing_torchvision: float  # the share of pixel values that differ
    max_logit_difference_torchvision: float  # what that difference does to the model's logits
    top1_agreement_torchvision: float
    passed: bool

    def line(self) -> str:
        verdict = "equal to" if self.passed else "DIFFERENT from"
        return (
            f"preprocessing: {verdict} {self.processor} (PIL backend) on {self.images} images (max |diff| "
            f"{self.max_difference_pil:.1e}); its torchvision backend differs by up to "
            f"{self.max_difference_torchvision:.0f}/255 on {self.pixels_differing_torchvision:.2%} of pixel values, "
            f"logits by {self.max_logit_difference_torchvision:.1e}, top-1 agreement "
            f"{self.top1_agreement_torchvision:.0%}"
        )


def load_processor(folder: Path, backend: str, trust_remote_code: bool) -> Any:
    import transformers

    return transformers.AutoImageProcessor.from_pretrained(
        folder, backend=backend, local_files_only=True, trust_remote_code=trust_remote_code
    )


def preprocessing_of(processor: Any) -> Preprocessing:
    """The contract's description of what `processor` does to an image; ValueError, in one line, for a step it
    cannot describe."""
    name = type(processor).__name__
    switched_on = sorted(
        key
        for key, value in vars(processor).items()
        if key.startswith("do_")
        and value is True
        and key not in HARMLESS_STEPS
        and key not in ("do_resize", "do_center_crop", "do_rescale", "do_normalize")
    )
    if switched_on:
        raise ValueError(f"{name} also does {', '.join(switched_on)}, which handoff's image preprocessing does not")
    if not processor.do_resize:
        raise ValueError(f"{name} does not resize (do_resize false): served images would come in any size")
    if not processor.do_rescale or not math.isclose(processor.rescale_factor, 1 / 255, rel_tol=1e-9):
        raise ValueError(f"{name} rescales by {processor.rescale_factor if processor.do_rescale else 1}, not 1/255")
    resample = int(getattr(processor.resample, "value", processor.resample))
    if resample not in RESAMPLE:
        raise ValueError(f"{name} resamples with PIL filter {resample}; handoff serves {', '.join(RESAMPLE.values())}")
    resize, mode, crop = _sizes(processor, name)
    normalize = processor.do_normalize
    channels = len(processor.image_mean) if normalize and isinstance(processor.image_mean, (list, tuple)) else 3
    return Preprocessing(
        crop=crop,
        resize=resize,
        mean=tuple(float(v) for v in _per_channel(processor.image_mean, channels)) if normalize else (0.0,) * 3,
        std=tuple(float(v) for v in _per_channel(processor.image_std, channels)) if normalize else (1.0,) * 3,
        interpolation=RESAMPLE[resample],
        resize_mode=mode,
        crop_offset="floor",
    )


def _per_channel(value: float | list[float], channels: int) -> list[float]:
    return list(value) if isinstance(value, (list, tuple)) else [value] * channels


def _sizes(processor: Any, name: str) -> tuple[int, str, int]:
    """(resize, resize mode, crop) from the processor's `size` and `crop_size`."""
    size = {key: value for key, value in dict(processor.size).items() if value is not None}
    crop_pct = getattr(processor, "crop_pct", None)
    if set(size) == {"height", "width"}:
        if size["height"] != size["width"]:
            raise ValueError(f"{name} resizes to {size['height']}x{size['width']}: a non-square size, until tried")
        resize, mode = int(size["height"]), "exact"
    elif set(size) == {"shortest_edge"}:
        resize, mode = int(size["shortest_edge"]), "shorter"
        if crop_pct is not None and name.startswith("ConvNext"):  # its own resize, then the crop to shortest_edge
            if resize >= CONVNEXT_CROP_BELOW:
                return resize, "exact", resize
            return int(resize / crop_pct), "shorter", resize
    else:
        raise ValueError(f"{name} resizes to {size}; handoff serves a square size or a shortest edge")
    if not processor.do_center_crop:
        if mode == "shorter":
            raise ValueError(f"{name} resizes the shortest edge without a crop: served images would vary in size")
        return resize, mode, resize
    crop = {key: value for key, value in dict(processor.crop_size).items() if value is not None}
    if set(crop) != {"height", "width"} or crop["height"] != crop["width"]:
        raise ValueError(f"{name} crops to {crop}: a non-square crop, until tried")
    if int(crop["height"]) > resize:
        raise ValueError(f"{name} crops {crop['height']} pixels from an image resized to {resize}: it would pad")
    return resize, mode, int(crop["height"])


def check_images(photos: list[Image.Image]) -> list[Image.Image]:
    """Real photos and the same photos in shapes that exercise every step: an odd crop margin each way, grayscale,
    tiny, wide."""
    first = photos[0]
    return [
        *photos,
        first.resize((301, 227)),
        first.resize((227, 303)),
        first.convert("L"),
        first.resize((7, 5)),
        first.resize((900, 120)),
    ]


def check_processor(
    folder: Path, model: nn.Module, preprocess: dict[str, Any], photos: list[Image.Image], trust_remote_code: bool
) -> ProcessorCheck:
    """The service's preprocessing (contract/pil_transform.py) against transformers' processor saved in `folder`,
    both backends, on `photos` and check_images' variations, and `model`'s logits on the torchvision backend's."""
    images = check_images(photos)
    served_by = Preprocessor.from_manifest(preprocess, max_pixels=1 << 40)
    served = np.stack([served_by(image) for image in images])
    pil = load_processor(folder, "pil", trust_remote_code)
    by_pil = np.asarray(pil([image.convert("RGB") for image in images], return_tensors="np")["pixel_values"])
    by_torchvision = _torchvision_pixels(folder, images, trust_remote_code)
    std = served_by.std.reshape(1, -1, 1, 1)
    difference = np.abs(served - by_torchvision) * std * 255  # in 8-bit pixel values
    with torch.inference_mode():
        ours = model(torch.from_numpy(served).float())
        theirs = model(torch.from_numpy(by_torchvision).float())
    difference_pil = float(np.abs(served - by_pil).max()) if served.shape == by_pil.shape else math.inf
    return ProcessorCheck(
        processor=type(pil).__name__.removesuffix("Pil"),
        images=len(images),
        max_difference_pil=difference_pil,
        max_difference_torchvision=float(np.round(difference.max())),
        pixels_differing_torchvision=float((difference > 0.5).mean()),
        max_logit_difference_torchvision=float((ours - theirs).abs().max()),
        top1_agreement_torchvision=float((ours.argmax(1) == theirs.argmax(1)).float().mean()),
        passed=difference_pil <= EXACT,
    )


def _torchvision_pixels(folder: Path, images: list[Image.Image], trust_remote_code: bool) -> np.ndarray:
    default = load_processor(folder, "torchvision", trust_remote_code)
    return np.asarray(default([image.convert("RGB") for image in images], return_tensors="pt")["pixel_values"])


def report(check: ProcessorCheck) -> dict[str, Any]:
    """The manifest's `preprocess_check` block."""
    return asdict(check)


def hf_preprocessing(folder: Path, trust_remote_code: bool) -> tuple[Any, Preprocessing]:
    """The image processor saved in `folder` (its PIL backend) and what it does to an image; ValueError, in one
    line naming the folder, for a step the contract cannot describe."""
    processor = load_processor(folder, "pil", trust_remote_code)
    try:
        return processor, preprocessing_of(processor)
    except ValueError as err:
        raise ValueError(f"{folder}: {err}") from None
